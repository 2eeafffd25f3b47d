"""report.html: one self-contained page per run, written next to summary.md, with the verdict table,
parameters, provenance, the plots inline and the tails of the logs."""

from __future__ import annotations

import base64
import os
import re
import textwrap
from pathlib import Path

from bridge.config import Config
from bridge.core.result import RunContext
from bridge.presets.preset import Preset
from bridge.run.execute import execute
from tests.bridge.bus_support import WRITE_REPORT_PY

PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000") + b"<script>x</script>"


def test_a_run_writes_a_self_contained_page(tmp_path: Path):
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "prog.py").write_text(
        WRITE_REPORT_PY
        + textwrap.dedent(f"""
            import sys
            for i in range(100):
                print(f"line {{i}} <b>")
            print("warned & done", file=sys.stderr)
            open(os.path.join(os.environ["KAKEYA_RUN_DIR"], "ladder.png"), "wb").write({PNG!r})
            write_report()
        """)
    )
    preset = Preset.model_validate(
        {
            "name": "paged",
            "description": "test",
            "runners": ["cpu"],
            "timeout_s": 30,
            "argv": ["{python}", "prog.py", "{tag}"],
            "params": {"tag": {"type": "str", "pattern": "[a-z<>]+", "max_length": 9, "default": "x"}},
            "report": {"kind": "probe", "schema_version": 1},
            "gate": [
                {"check": "min", "path": "/probe/cpu_count", "value": 1},
                {"check": "max", "path": "/probe/cpu_count", "value": 0},
            ],
        }
    )
    out = tmp_path / "out"
    context = RunContext(request_id="r-1", subject="a" * 40, runner_name="r1", runner_labels=["cpu"])
    result = execute(
        preset,
        preset.validate_params({"tag": "<i>"}),
        checkout,
        out,
        config=Config(),
        environ={"PATH": os.environ["PATH"], "HOME": str(tmp_path)},
        context=context,
    )
    assert result.verdict == "fail"
    page = (out / "report.html").read_text()
    assert (out / "summary.md").is_file()
    # self-contained: no link or source outside the page; the plot's bytes are inline
    assert not re.search(r"(src|href)=\"(?!data:)", page)
    assert f'src="data:image/png;base64,{base64.b64encode(PNG).decode()}"' in page
    # the verdict table: one row per check with its status, value and threshold; the failing one says why
    assert '<h2>Verdict: <b class="fail">fail</b></h2>' in page
    rows = re.findall(r"<tr><td><b class=\"(pass|fail)\">", page)
    assert rows == ["pass", "fail"]
    assert "/probe/cpu_count" in page
    # parameters and provenance, escaped
    assert "<code>&lt;i&gt;</code>" in page and "<i>" not in page
    assert f"<td>subject</td><td>{'a' * 40}</td>" in page and "<td>request</td><td>r-1</td>" in page
    assert f"<td>preset hash</td><td>{preset.content_hash}</td>" in page
    # log tails: the last 60 lines of stdout, all of stderr, escaped
    assert "line 99 &lt;b&gt;" in page and "line 40 &lt;b&gt;" in page and "line 39 &lt;b&gt;" not in page
    assert "warned &amp; done" in page
    assert "<script>" not in page
