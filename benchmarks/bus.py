"""Benchmark the git bus; writes JSON. Not a test: it measures, it asserts nothing.

    python -m benchmarks.bus                     # writes benchmarks/results/bus.json
    python -m benchmarks.bus --parts slurm       # writes benchmarks/results/bus-slurm.json

  overhead     local round trip: wall time of `kakeya run probe` minus `kakeya exec probe` (both as CLI
               processes, alternated, in a clean clone of this repository; median of --repeats each)
  pickup       seconds from `kakeya request` returning to the program starting on a `kakeya runner
               watch --poll 0.5` process, over `git daemon` on 127.0.0.1 (median and max of --pickups)
  throughput   wall time for 1 and for 4 runner processes (already polling) to finish 40 requests of a
               preset that sleeps 1 s, pushed to the bus at once (over `git daemon`); speedup = time(1) / time(4)
  slurm        pickup and throughput (40 requests) through one Slurm runner (a single-node test Slurm with
               8 slots, tests/bridge/slurm_support.py; needs root and Debian's Slurm packages) vs 4 local
               runners, measured one after the other on the same bus server

Targets (issue 3): overhead <= 1 s, pickup <= 1.5 s, speedup >= 3.5.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.harness import RESULTS, ROOT
from bridge.client.client import Client
from bridge.config import load_config
from bridge.wire import git as G

ISOLATION = "none"

PROGRAM = textwrap.dedent("""
    import json, os, sys, time
    start = time.time()
    tag, seconds = sys.argv[1], float(sys.argv[2])
    with open(os.path.join(os.environ["MARKS"], tag), "w") as fh:
        fh.write(repr(start))
    time.sleep(seconds)
    json.dump({"kind": "bench", "schema_version": 1}, open(os.environ["KAKEYA_REPORT"], "w"))
""")
PRESET = textwrap.dedent("""
    name: bench
    description: records when it started, sleeps, writes a report
    runners: [cpu, slurm]
    timeout_s: 120
    argv: ["{python}", "bench_program.py", "{tag}", "{seconds}"]
    params:
      tag: {type: str, pattern: "[a-z0-9-]+", max_length: 40, default: x}
      seconds: {type: float, min: 0, max: 60, default: 0}
    env:
      MARKS: "${ENV:KAKEYA_BENCH_MARKS}"
    report: {kind: bench, schema_version: 1}
""")


def sh(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), cwd=cwd, env=env, check=True, capture_output=True, text=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kakeya(*args: str) -> list[str]:
    return [sys.executable, "-m", "bridge.cli", *args]


def overhead(work: Path, repeats: int) -> dict[str, Any]:
    """`kakeya run probe` vs `kakeya exec probe` in a clean clone (the presets of this checkout)."""
    clone = work / "clone"
    work.mkdir(parents=True)
    sh("git", "clone", "-q", str(ROOT), str(clone), cwd=work)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAKEYA_")}
    env["KAKEYA_PRESETS"] = str(ROOT / "presets")
    times: dict[str, list[float]] = {"run": [], "exec": []}
    subprocess.run(
        kakeya("run", "probe", "--out", str(work / "warm")),
        cwd=clone,
        env=env,
        check=True,
        capture_output=True,
    )  # creates the embedded bus and the runner mirror
    for i in range(repeats):
        for mode in ("run", "exec"):
            t0 = time.perf_counter()
            subprocess.run(
                kakeya(mode, "probe", "--out", str(work / f"{mode}{i}")),
                cwd=clone,
                env=env,
                check=True,
                capture_output=True,
            )
            times[mode].append(time.perf_counter() - t0)
    diffs = [r - e for r, e in zip(times["run"], times["exec"], strict=True)]
    return {
        "run_s": times["run"],
        "exec_s": times["exec"],
        "median_run_s": statistics.median(times["run"]),
        "median_exec_s": statistics.median(times["exec"]),
        "overhead_s": statistics.median(times["run"]) - statistics.median(times["exec"]),
        "median_paired_overhead_s": statistics.median(diffs),
        "target_s": 1.0,
    }


class Bench:
    """A project with the bench preset, a `git daemon` serving its bus, and runner processes."""

    def __init__(self, work: Path):
        self.work = work
        self.project, self.presets, self.marks = work / "project", work / "presets", work / "marks"
        for d in (self.project, self.presets, self.marks):
            d.mkdir(parents=True)
        (self.presets / "bench.yaml").write_text(PRESET)
        # label `slurm` runs as Slurm jobs (the `slurm` part); `cpu` runs locally
        (self.project / "kakeya.toml").write_text(
            '[executors.slurm]\nexecutor = "slurm"\nmax_in_flight = 16\n'
        )
        (self.project / "bench_program.py").write_text(PROGRAM)
        sh("git", "init", "-q", "-b", "main", cwd=self.project)
        sh("git", "add", "-A", cwd=self.project)
        sh(
            "git",
            "-c",
            "user.name=bench",
            "-c",
            "user.email=bench@example.com",
            "commit",
            "-qm",
            "bench",
            cwd=self.project,
        )
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("KAKEYA_")}
        self.env.update(
            {
                "KAKEYA_PRESETS": str(self.presets),
                "KAKEYA_BENCH_MARKS": str(self.marks),
                # the program marks its start in a directory outside any sandbox: runs are unsandboxed here,
                # local and Slurm alike (recorded in the JSON); the sandbox's own cost is not measured
                "KAKEYA_ISOLATION": ISOLATION,
                "OMP_NUM_THREADS": "1",
            }
        )
        served = work / "served"
        served.mkdir()
        self.port = free_port()
        self.daemon = subprocess.Popen(
            [
                "git",
                "daemon",
                "--reuseaddr",
                "--export-all",
                "--enable=receive-pack",
                f"--base-path={served}",
                "--listen=127.0.0.1",
                f"--port={self.port}",
                "--max-connections=64",
                str(served),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.buses = served
        self.n = 0
        time.sleep(0.5)

    def bus(self) -> str:
        self.n += 1
        G.init_bare(self.buses / f"bus{self.n}.git")
        return f"git://127.0.0.1:{self.port}/bus{self.n}.git"

    def client(self, url: str) -> Client:
        os.environ.update(self.env)
        return Client(load_config(self.project), root=self.project, remote=url)

    def runners(self, url: str, count: int, poll: float, label: str = "cpu") -> list[subprocess.Popen[bytes]]:
        return [
            subprocess.Popen(
                kakeya(
                    "runner",
                    "watch",
                    "--labels",
                    label,
                    "--name",
                    f"bench{i}",
                    "--remote",
                    url,
                    "--poll",
                    str(poll),
                    "--workdir",
                    str(self.work / "runners" / f"bench{i}"),
                ),
                cwd=self.project,
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for i in range(count)
        ]

    def close(self) -> None:
        self.daemon.terminate()
        self.daemon.wait()


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(60)


def done_on_disk(bus: Path) -> int:
    """Done refs of the served repository, read from its files: measuring starts no process at all."""
    loose = bus / "refs" / "heads" / "kakeya" / "done"
    names = set(os.listdir(loose)) if loose.is_dir() else set()
    packed = bus / "packed-refs"
    if packed.is_file():
        names |= {
            ln.rsplit("/", 1)[1] for ln in packed.read_text().splitlines() if " refs/heads/kakeya/done/" in ln
        }
    return len(names)


def done_count(client: Client) -> int:
    return sum(1 for e in client.bus.ls_remote().entries.values() if e.done)


def pickup(bench: Bench, count: int, label: str = "cpu") -> dict[str, Any]:
    url = bench.bus()
    client = bench.client(url)
    procs = bench.runners(url, 1, 0.5, label)
    try:
        time.sleep(3)  # the runner is up and polling
        latencies = []
        for i in range(count):
            client.request("bench", {"tag": f"{label}-p{i}"}, label)
            pushed = time.time()
            mark = bench.marks / f"{label}-p{i}"
            while not mark.exists() or not mark.read_text():
                time.sleep(0.01)
            latencies.append(float(mark.read_text()) - pushed)
            while done_count(client) < i + 1:
                time.sleep(0.1)
            time.sleep(0.25 * (i % 3))  # requests land at different phases of the poll
    finally:
        stop(procs)
    return {
        "poll_s": 0.5,
        "latencies_s": latencies,
        "median_s": statistics.median(latencies),
        "max_s": max(latencies),
        "target_s": 1.5,
    }


def throughput(bench: Bench, runners: int, requests: int, sleep_s: float, label: str = "cpu") -> float:
    """Runners up and polling an empty bus; the requests land in one push; time until all are done."""
    url = bench.bus()
    staging = G.init_bare(bench.work / f"staging{label}{runners}.git")
    local = bench.client(str(staging))
    for i in range(requests):
        local.request("bench", {"tag": f"t{label}{runners}-{i}", "seconds": str(sleep_s)}, label)
    procs = bench.runners(url, runners, 0.5, label)
    try:
        time.sleep(3)
        sh("git", "push", "-q", url, "refs/heads/kakeya/*:refs/heads/kakeya/*", cwd=staging)
        t0 = time.perf_counter()
        while done_on_disk(bench.buses / f"bus{bench.n}.git") < requests:
            time.sleep(0.05)
        elapsed = time.perf_counter() - t0
    finally:
        stop(procs)
    return elapsed


def slurm(bench: Bench, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One Slurm runner (test cluster, 8 slots) vs 4 local runners: pickup latency and throughput."""
    from tests.bridge.slurm_support import Cluster

    root.mkdir(parents=True)
    cluster = Cluster(root).start()
    bench.env.update(cluster.env)
    version = cluster.run("sbatch", "--version").strip()
    try:
        slurm_pickup = pickup(bench, args.pickups, "slurm")
        slurm_s = throughput(bench, 1, args.requests, args.sleep, "slurm")
        local_s = throughput(bench, 4, args.requests, args.sleep, "cpu")
    finally:
        cluster.stop()
    return {
        "requests": args.requests,
        "sleep_s": args.sleep,
        "slurm_pickup": slurm_pickup,
        "one_slurm_runner_s": slurm_s,
        "four_local_runners_s": local_s,
        "slurm_slots": 8,
        "slurm_version": version,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="the JSON (default benchmarks/results/bus.json; bus-slurm.json for --parts slurm alone)",
    )
    parser.add_argument("--repeats", type=int, default=5, help="overhead: runs of each command")
    parser.add_argument("--pickups", type=int, default=10, help="pickup: requests to time")
    parser.add_argument("--requests", type=int, default=40, help="throughput: queued requests")
    parser.add_argument("--sleep", type=float, default=1.0, help="throughput: seconds each request sleeps")
    parser.add_argument(
        "--parts", default="overhead,pickup,throughput", help="which measurements (comma-separated)"
    )
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if args.out is None:
        args.out = RESULTS / ("bus-slurm.json" if parts == {"slurm"} else "bus.json")
    work = Path(tempfile.mkdtemp(prefix="kakeya-bench-bus-"))
    started = time.time()
    load_before = harness.load_average()  # 1, 5, 15 min: other work on the machine meanwhile
    try:
        result: dict[str, Any] = {"isolation": ISOLATION, "command": harness.command("bus")}
        if "overhead" in parts:
            result["overhead"] = overhead(work / "overhead", args.repeats)
            print(json.dumps(result["overhead"]), flush=True)
        bench = Bench(work / "bus")
        try:
            if "pickup" in parts:
                result["pickup"] = pickup(bench, args.pickups)
                print(json.dumps(result["pickup"]), flush=True)
            if "throughput" in parts:
                one = throughput(bench, 1, args.requests, args.sleep)
                four = throughput(bench, 4, args.requests, args.sleep)
                result["throughput"] = {
                    "requests": args.requests,
                    "sleep_s": args.sleep,
                    "one_runner_s": one,
                    "four_runners_s": four,
                    "speedup": one / four,
                    "target_speedup": 3.5,
                }
                print(json.dumps(result["throughput"]), flush=True)
            if "slurm" in parts:
                result["slurm"] = slurm(bench, work / "slurm", args)
                print(json.dumps(result["slurm"]), flush=True)
        finally:
            bench.close()
        result["wall_s"] = time.time() - started
        result["environment"] = harness.environment(load_before)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    harness.write_json(args.out, result)


if __name__ == "__main__":
    main()
