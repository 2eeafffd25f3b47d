"""A cold `kakeya gate pr` of two code trees, interleaved on one bus, so that both see the same host: on a
shared 2-core VM whose speed changes from minute to minute, two runs of benchmarks/bus_scale.py minutes apart
can differ by 40%, more than a change being measured. The bus is bus_scale's (a real run, a history of --size
results written with `git fast-import`, the old ones moved into the ledger, served by `git daemon` through
the byte-counting relay); each round gates, in a fresh depth-1 clone, the three subjects of bus_scale's
`gate_cold` (1 run in the ledger, 50 runs in the ledger, the newest), once with each tree, the order
alternating from round to round. Not a test: it measures, it asserts nothing.

    git worktree add /tmp/before <commit>
    .venv/bin/python -m benchmarks.gate_ab --before /tmp/before --rounds 10 --out benchmarks/results/gate_ab.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import bus_scale as B
from benchmarks import harness
from benchmarks.harness import ROOT

SUBJECTS = ("1_runs", "50_runs", "recent")


def measure(work: Path, size: int, trees: dict[str, Path], rounds: int) -> dict:
    served = work / "served"
    bus = B.G.init_bare(served / "bus.git")
    B.G.run(bus, "config", "uploadpack.allowFilter", "true")
    project, env = B.bench_project(work)
    B.sh("git", "push", "-q", str(bus), "main", cwd=project, env=env)
    times: dict[str, dict[str, list[float]]] = {name: {s: [] for s in SUBJECTS} for name in trees}
    with B.serve(served, "git") as (url, _relay):
        real = B.sh(*B.kakeya("request", "bench", "--runner", "cpu", "--remote", url), cwd=project, env=env)
        B.sh(*B.kakeya("runner", "once", "--labels", "cpu", "--remote", url), cwd=project, env=env)
        tpl = B.template(bus, B.G.refs_under(bus, B.DONE_PREFIX)[B.done_ref(real.stdout.strip())])
        made = B.write_history(bus, tpl, size - 1, days=size / 100)
        B.compact_in_place(bus, B.utcnow() - dt.timedelta(days=2))
        newest = B.G.refs_under(bus, B.DONE_PREFIX)[B.done_ref(made["ids"][-1])]
        subjects = {f"{runs}_runs": s for runs, s in made["subjects"].items()}
        subjects["recent"] = json.loads(B.G.read_path(bus, newest, B.MANIFEST_PATH) or b"{}")["subject"]
        order = list(trees.items())
        for r in range(rounds):
            for what in SUBJECTS:
                for name, root in order if r % 2 == 0 else order[::-1]:
                    ci = work / "ci"
                    shutil.rmtree(ci, ignore_errors=True)
                    B.sh("git", "clone", "-q", "--depth", "1", url, str(ci), cwd=work, env=env)
                    argv = [sys.executable, "-m", "bridge.cli", "gate", "pr", "--subject", subjects[what]]
                    argv += ["--require", "bench@cpu", "--remote", url, "--allow-unsigned"]
                    t0 = time.perf_counter()
                    proc = subprocess.run(
                        argv, cwd=ci, env={**env, "PYTHONPATH": str(root)}, capture_output=True, text=True
                    )
                    times[name][what].append(round(time.perf_counter() - t0, 3))
                    if proc.returncode != 0:
                        raise SystemExit(f"{name} {what}: gate pr failed: {proc.stderr[-400:]}")
    return {
        name: {
            what: {"median_s": statistics.median(ts), "max_s": max(ts), "min_s": min(ts), "runs_s": ts}
            for what, ts in by.items()
        }
        for name, by in times.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the older code")
    parser.add_argument("--size", type=int, default=1000, help="finished requests on the bus")
    parser.add_argument("--rounds", type=int, default=10, help="cold gates per subject and tree")
    parser.add_argument("--out", type=Path, help="write the JSON here (default: print it)")
    args = parser.parse_args()
    before = B.G.out(args.before, "rev-parse", "--short", "HEAD")
    now = B.G.out(ROOT, "rev-parse", "--short", "HEAD")
    trees = {f"before ({before})": args.before.resolve(), f"now ({now})": ROOT}
    load0 = harness.load_average()
    with tempfile.TemporaryDirectory(prefix="kakeya-gate-ab-") as tmp:
        figures = measure(Path(tmp), args.size, trees, args.rounds)
    result = {
        "benchmark": "gate_ab",
        "command": harness.command("gate_ab"),
        "python": sys.executable,
        "size": args.size,
        "gate_cold": figures,
        "environment": harness.environment(load0),
    }
    if args.out:
        harness.write_json(args.out, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
