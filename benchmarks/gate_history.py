"""What a cold `kakeya gate pr` downloads when the subject has a past (benchmarks/bus_scale.py's projects have
none): a project of --commits commits of --blob-bytes of random bytes each, one real run on its head over
`git daemon` (through bus_scale's byte-counting relay), then `gate pr` of the head from a depth-1 checkout (as
pr-gate.yml runs it) of:

  base_on_bus      the PR's base, the head's 6th parent back, which the bus has (pr-gate.yml's default bus is
                   the project's own repository)
  base_not_on_bus  a base the bus lacks (a bus repository of its own, where nobody requested a run on the
                   base): a commit on the head's 6th parent that was never pushed
  head             the head itself

Not a test: it measures, it asserts nothing.

    python -m benchmarks.gate_history --out benchmarks/results/gate_history.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks import bus_scale as B
from benchmarks import harness


def measure(work: Path, commits: int, blob_bytes: int) -> dict:
    served = work / "served"
    B.G.init_bare(served / "bus.git")
    project, env = B.bench_project(work)

    def sh(*argv: str, cwd: Path = project) -> str:
        return subprocess.run(
            argv, cwd=cwd, env=env, check=True, capture_output=True, text=True
        ).stdout.strip()

    for i in range(commits):
        (project / "big.bin").write_bytes(os.urandom(blob_bytes))
        sh("git", "add", "big.bin")
        sh("git", "commit", "-qm", f"past {i}")
    head = sh("git", "rev-parse", "HEAD")
    sh("git", "branch", "base", "HEAD~6")
    sh("git", "checkout", "-q", "-b", "other", "HEAD~6")
    (project / "other.txt").write_text("a base the bus lacks\n")
    sh("git", "add", "other.txt")
    sh("git", "commit", "-qm", "other base")
    sh("git", "checkout", "-q", "main")
    out: dict = {"commits": commits, "blob_bytes": blob_bytes}
    with B.serve(served, "git") as (url, relay):
        sh("git", "push", "-q", url, "main")
        sh(*B.kakeya("request", "bench", "--runner", "cpu", "--remote", url))
        sh(*B.kakeya("runner", "once", "--labels", "cpu", "--remote", url))
        for what, checkout in (("base_on_bus", "base"), ("base_not_on_bus", "other"), ("head", "main")):
            ci = work / f"ci-{checkout}"
            sh(
                "git",
                "clone",
                "-q",
                "--depth",
                "1",
                "--branch",
                checkout,
                f"file://{project}",
                str(ci),
                cwd=work,
            )
            relay.reset()
            t0 = time.perf_counter()
            proc = subprocess.run(
                B.kakeya(
                    "gate",
                    "pr",
                    "--subject",
                    head,
                    "--require",
                    "bench@cpu",
                    "--remote",
                    url,
                    "--allow-unsigned",
                ),
                cwd=ci,
                env=env,
                capture_output=True,
                text=True,
            )
            out[f"gate_cold_from_{what}"] = {
                "bytes": relay.up + relay.down,
                "bytes_down": relay.down,
                "seconds": round(time.perf_counter() - t0, 3),
                "rc": proc.returncode,
                "line": proc.stdout.strip()[:200],
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--commits", type=int, default=200, help="commits in the subject's past")
    parser.add_argument("--blob-bytes", type=int, default=20000, help="random bytes each commit changes")
    parser.add_argument("--out", type=Path, help="write the JSON here (default: print it)")
    args = parser.parse_args()
    if args.commits < 7:
        parser.error("--commits must be 7 or more: the PR's base is the head's 6th parent back")
    load_before = harness.load_average()
    with tempfile.TemporaryDirectory(prefix="kakeya-gate-history-") as tmp:
        figures = measure(Path(tmp), args.commits, args.blob_bytes)
    result = {
        "benchmark": "gate_history",
        "command": harness.command("gate_history"),
        **figures,
        "environment": harness.environment(load_before),
    }
    if args.out:
        harness.write_json(args.out, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
