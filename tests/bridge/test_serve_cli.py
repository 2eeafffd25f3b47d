"""`kakeya serve` is `python -m engine.serve` with the same flags (the bridge imports no engine: it execs it),
and an install that lacks what the engine needs is told in one line."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from bridge.cli.main import main
from tests.bridge.bus_support import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_kakeya_serve_serves_the_engine_over_http(tmp_path: Path):
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    kakeya = Path(sys.executable).with_name("kakeya")
    proc = subprocess.Popen(
        [str(kakeya), "serve", "--model", "zoo:tiny-hybrid", "--host", "127.0.0.1", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as r:
                    models = json.load(r)
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
                assert time.monotonic() < deadline, "kakeya serve did not answer in 120 s"
                time.sleep(0.2)
        assert [m["id"] for m in models["data"]] == ["zoo:tiny-hybrid"]
        body = json.dumps({"model": "zoo:tiny-hybrid", "prompt": "def add(a, b):", "max_tokens": 4}).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            done = json.load(r)
        assert done["usage"]["completion_tokens"] == 4 and isinstance(done["choices"][0]["text"], str)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("lacks", ["fastapi", "engine"])
def test_an_install_without_the_engine_or_the_serve_extra_is_told_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys, lacks: str
):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == lacks else real(name, *a)
    )
    assert main(["serve", "--port", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"kakeya: error: kakeya serve runs the engine, and this install lacks {lacks}: from a checkout of kakeya, "
        "pip install -e '.[torch,serve]' (or '.[mlx,serve]')"
    ]
