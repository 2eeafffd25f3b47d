"""The throughput report's parity evidence (issue 31): per prompt and batch size, digests of the plain
greedy and the speculative token lists, checked equal by the throughput-code gate; the batch table
(greedy vs batched speculative tok/s, acceptance); plain vs speculative sampling at a temperature."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from engine.workloads import throughput
from tests.engine.test_workloads_zoo import _argv, _gate

PARAMS = {"drafter": "lookup", "prompts": 2, "new_tokens": 16, "repeats": 1, "batches": [1, 3], "k": 3}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("tp") / "tp.json"
    argv = _argv("throughput-code", {**PARAMS, "temperature": 0.7}, out)
    assert "--temperature" in argv
    assert throughput.main([*argv[3:], "--plot", "none"]) == 0
    return json.loads(out.read_text())


def test_digests_per_prompt_and_batch_size_and_the_gate_passes(report: dict[str, Any]) -> None:
    # prompt 0 decoded unbatched (batch 1) and by rows 0 and 2 of the batch of 3; prompt 1 by row 1
    rows = [[(d["batch"], d["row"]) for d in p["digests"]] for p in report["prompts"]]
    assert rows == [[(1, 0), (3, 0), (3, 2)], [(1, 0), (3, 1)]]
    assert all(d["greedy"] == d["speculative"] for p in report["prompts"] for d in p["digests"])
    assert report["prompts"][0]["digests"][0]["greedy"] != report["prompts"][1]["digests"][0]["greedy"]
    for b in report["batched"]:
        sp = b["speculative"]
        assert b["exact"] and sp["exact"] and sp["decode_tok_s"] > 0 and sp["acceptance_length"] >= 1
        assert all(0 <= x <= 1 for x in sp["position_acceptance"])
    for p in report["prompts"]:
        s = p["sampled"]
        assert s["temperature"] == 0.7 and s["plain_decode_tok_s"] > 0 and 0 <= s["acceptance_rate"] <= 1
        assert s["seeds"] == [0] and s["speculative_forwards"] > 0 and len(s["position_acceptance"]) == 3
        assert "digests" not in s  # sampled streams differ from greedy: no parity check applies to them
    sm = report["summary"]["sampled"]
    assert sm["temperature"] == 0.7 and sm["speedup"] > 0 and sm["mean_acceptance_length"] >= 1
    verdict = _gate(report, "throughput-code")
    assert not verdict.violations
    assert [c.status for c in verdict.checks if c.check in ("all_true", "same")] == ["pass", "pass"]


def test_a_forged_or_missing_digest_fails_the_gate(report: dict[str, Any]) -> None:
    forged = copy.deepcopy(report)
    d = forged["prompts"][1]["digests"][1]
    d["speculative"] = "0" * 16 if d["speculative"] != "0" * 16 else "1" * 16
    checks = _gate(forged, "throughput-code").checks
    # (speedup_ok depends on this machine's load: only the parity checks are asserted)
    assert [(c.check, c.status, c.at) for c in checks if c.check in ("all_true", "same")] == [
        ("all_true", "pass", "/prompts/0/exact"),
        ("same", "fail", "/prompts/1/digests/1"),
    ]
    gone = copy.deepcopy(report)
    for p in gone["prompts"]:
        p["digests"] = []
    assert _gate(gone, "throughput-code").status == "fail"
    bad = copy.deepcopy(report)
    bad["prompts"][0]["digests"][0]["speculative"] = "not a digest"
    assert _gate(bad, "throughput-code").violations  # the schema: 16 hex digits
