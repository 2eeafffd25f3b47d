"""The bus at a team's scale (issue 27): what each hot path costs, in bytes on the wire and seconds, on buses
holding 100, 1,000 and 10,000 finished requests. Not a test: it measures, it asserts nothing.

    python -m benchmarks.bus_scale --sizes 100,1000,10000 --out benchmarks/results/bus_scale.json

Each bus starts from a real run (a `kakeya runner` serves a real request over `git daemon`); its done
result is the template of the history, written with one `git fast-import` in exactly the shape real runs
leave (`write_history`: request commit on the subject, claim commit, done commit with the same files, a done
ref and a by-subject index ref; no request or claim ref), spread over subjects of 1 and of 50 runs.
tests/bridge/test_bus_layout.py checks those shapes against a real run. Every command talks to `git daemon`
through `Relay`, a TCP relay that counts the bytes each way.

  poll         an idle `runner once` (nothing to do)
  request      `kakeya request` (one new live request)
  pickup       `runner once` that claims, runs and pushes that request (seconds: the whole serve; claim_s: from
               its start, Python's included, to the claim on the bus)
  pickup_watch a watching runner (0.5 s poll): `kakeya request` returning to the claim on the bus, and the
               runner's own part (the poll that found it, to the claim)
  wait         one look of `kakeya wait` at a finished request (the listing and the done commit)
  status       `kakeya status` (live + recent)
  runners      `kakeya runners`
  results      `kakeya results ID` into a fresh clone
  gate_cold    `kakeya gate pr` in a fresh depth-1 clone (as pr-gate.yml runs it), subject with 1 / 50 runs,
               and the newest (its results still in refs): the median of --gate-repeats runs, and the slowest
  gate_warm    the same again in the same clone
  clone        a teammate's `git clone` of the bus and a no-op `git fetch`
  gc           `kakeya bus gc --older-than 30`

Growth per operation = its cost at the largest size / at the smallest (the target: within 2x). `cpu_s` is the
client's CPU time (the command and the git it starts): on a shared host, what the command costs whatever the
load; `seconds` is wall time under that load.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.harness import RESULTS, ROOT
from bridge.bus.records import (
    CLAIM_PATH,
    DONE_PREFIX,
    MANIFEST_PATH,
    NS,
    Manifest,
    Snapshot,
    claim_ref,
    done_ref,
    id_preset,
    id_time,
    new_id,
    results_path,
    subject_ref,
    utcnow,
)
from bridge.wire import git as G
from tests.bridge.bus_support import WRITE_REPORT_PY, Daemon, HttpGit, probe_preset

# --- the relay ---------------------------------------------------------------------------------------


class Relay:
    """A TCP relay in front of `git daemon` on 127.0.0.1:`port` that counts the bytes each way: `url(name)`,
    `reset()`, then `down` (server to client) and `up`."""

    def __init__(self, port: int):
        self.target = port
        self.up = self.down = 0
        self.lock = threading.Lock()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, name: str = "bus.git") -> str:
        return f"git://127.0.0.1:{self.port}/{name}"

    def reset(self) -> None:
        with self.lock:
            self.up = self.down = 0

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:  # the daemon is gone (the end of a measurement)
                client.close()
                continue
            for a, b, way in ((client, upstream, "up"), (upstream, client, "down")):
                threading.Thread(target=self._pipe, args=(a, b, way), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, way: str) -> None:
        try:
            while data := src.recv(65536):
                with self.lock:
                    setattr(self, way, getattr(self, way) + len(data))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.server.close()


# --- history in the shape real runs leave -------------------------------------------------------------


def template(bus: Path, done: str) -> dict[str, Any]:
    """What `write_history` copies from a real done commit: its request, claim and result files, and the
    commits between it and its subject."""
    chain = G.out(bus, "rev-list", "--first-parent", done).split()
    manifest = json.loads(G.read_path(bus, done, MANIFEST_PATH) or b"{}")
    subject, rid = manifest["subject"], manifest["id"]
    chain = chain[: chain.index(subject)]
    results = G.read_dir(bus, done, results_path(rid))
    return {
        "id": rid,
        "subject": subject,
        "depth": len(chain),  # done, the claim commits, the request
        "request": G.read_path(bus, chain[-1], MANIFEST_PATH),
        "claim": G.read_path(bus, done, CLAIM_PATH),
        "results": results,
    }


def _commit(
    stream: list[bytes], mark: int, ref: str, parent: str, files: dict[str, bytes], msg: str, when: int
) -> str:
    text = msg.encode()
    stream.append(
        f"commit {ref}\nmark :{mark}\ncommitter kakeya <k@kakeya.invalid> {when} +0000\ndata {len(text)}\n".encode()
        + text
        + f"\nfrom {parent}\n".encode()
        + b"".join(f"M 100644 inline {p}\ndata {len(d)}\n".encode() + d + b"\n" for p, d in files.items())
        + b"\n"
    )
    return f":{mark}"


def request_json(template: bytes, rid: str, subject: str) -> bytes:
    """The template's request.json for request `rid` on `subject`: made at its id's time, same time to live."""
    made = Manifest.model_validate_json(template)
    created = id_time(rid)
    return made.model_copy(
        update={
            "id": rid,
            "subject": subject,
            "created_at": created,
            "expires_at": created + (made.expires_at - made.created_at),
        }
    ).dump()


def write_history(
    bus: Path, tpl: dict[str, Any], count: int, runs_per_subject: tuple[int, ...] = (1, 50), days: float = 30
) -> dict[str, Any]:
    """`count` finished requests like the template, written with `git fast-import`: per request a request
    commit on its subject, a claim commit and a done commit with the template's files (its id and subject
    replaced), a done ref and a by-subject index ref, and no request or claim ref (as a done push leaves it).
    The subjects are new commits on the template's subject: the first get `runs_per_subject` runs each, every
    other request a subject of its own. Ids are spread over the last `days` days, oldest first.
    Returns {"subjects": {runs: subject sha}, "ids": [...]}."""
    now = utcnow().replace(microsecond=0)
    when = int(now.timestamp())
    plan = [runs for runs in runs_per_subject] + [1] * max(0, count - sum(runs_per_subject))
    stream: list[bytes] = []
    salt = secrets.token_hex(4)  # a second history on the same bus gets subjects of its own
    for i in range(len(plan)):
        ref = f"refs/kakeya-import/s/{i:07d}"
        _commit(
            stream,
            i + 1,
            ref,
            tpl["subject"],
            {f"subject-{i}.txt": f"{i} {salt}\n".encode()},
            f"subject {i}",
            when,
        )
    G.run(bus, "fast-import", "--quiet", "--force", input=b"".join(stream))
    made = G.refs_under(bus, "refs/kakeya-import/s/")
    subjects = [made[f"refs/kakeya-import/s/{i:07d}"] for i in range(len(plan))]
    quota = [s for s, runs in zip(subjects, plan, strict=True) for _ in range(runs)][:count]
    old_id, old_subject = tpl["id"].encode(), tpl["subject"].encode()
    stream, mark, ids = [], 0, []
    for i, subject in enumerate(quota):
        rid = new_id(id_preset(tpl["id"]), now - dt.timedelta(seconds=days * 86400 * (count - i) / count))
        ids.append(rid)

        def swap(data: bytes, rid: str = rid, subject: str = subject) -> bytes:
            return data.replace(old_id, rid.encode()).replace(old_subject, subject.encode())

        tmp = "refs/kakeya-import/tmp"
        req = _commit(
            stream,
            mark + 1,
            tmp,
            subject,
            {MANIFEST_PATH: request_json(tpl["request"], rid, subject)},
            f"kakeya request {rid}",
            when,
        )
        claim = _commit(
            stream, mark + 2, tmp, req, {CLAIM_PATH: swap(tpl["claim"])}, f"kakeya claims {rid}", when
        )
        files = {f"{results_path(rid)}/{p}": swap(d) for p, d in tpl["results"].items()}
        done = _commit(stream, mark + 3, tmp, claim, files, f"kakeya done {rid}", when)
        mark += 3
        stream.append(f"reset {done_ref(rid)}\nfrom {done}\n\n".encode())
        stream.append(f"reset {subject_ref(subject, rid)}\nfrom {done}\n\n".encode())
    G.run(bus, "fast-import", "--quiet", "--force", input=b"".join(stream))
    G.run(
        bus,
        "update-ref",
        "--stdin",
        input="".join(f"delete {ref}\n" for ref in G.refs_under(bus, "refs/kakeya-import/")).encode(),
    )
    return {"subjects": {runs: subjects[i] for i, runs in enumerate(runs_per_subject)}, "ids": ids}


# --- the measurements --------------------------------------------------------------------------------

PROGRAM = WRITE_REPORT_PY + "write_report()\nprint('ran')\n"  # a valid probe report naming its subject
PRESET = probe_preset(
    "bench",
    "writes a probe report",
    ["{python}", "bench_program.py"],
    timeout_s=120,
    gate=[{"check": "min", "path": "/probe/cpu_count", "value": 1}],
)


def children_cpu() -> float:
    """The CPU seconds (user + system) of this process's finished children and theirs: what a command cost on
    the client, whatever the load of the host (the server's git runs under the daemon, not counted)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def sh(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def kakeya(*args: str) -> list[str]:
    return [sys.executable, "-m", "bridge.cli", *args]


@contextlib.contextmanager
def serve(base: Path, transport: str) -> Iterator[tuple[str, Relay]]:
    """The bare repositories under `base` served over `transport` (git: `git daemon`; http: `git http-backend`
    behind a small HTTP server; tests/bridge/bus_support.py's Daemon and HttpGit): (the bus URL through a
    byte-counting relay, the relay)."""
    if transport == "git":
        daemon = Daemon(base).start()
        relay = Relay(daemon.port)
        try:
            yield relay.url(), relay
        finally:
            daemon.stop()
    else:
        http = HttpGit(base)
        relay = Relay(http.port)
        try:
            yield http.repo(port=relay.port), relay
        finally:
            http.stop()
    relay.close()


def compact_in_place(bus: Path, cutoff: dt.datetime) -> int:
    """What the runners' compaction leaves (bridge/bus/ledger.py), written straight into the bus repository: the
    ledger commits, its maps, and the done and index refs of the results before `cutoff` deleted in one
    `git update-ref` transaction. A bus at its steady state in seconds, where the runners' first compaction of
    a large history takes many minutes (`--migrate runners` measures that). Returns the results moved."""
    from bridge.bus import ledger as L

    text = G.out(bus, "for-each-ref", "--format=%(objectname)\t%(refname)", NS)
    snap = Snapshot.parse(text + "\n")
    old = [e for e in snap.entries.values() if e.done and e.created_at < cutoff]
    tip = L.ledger_commits(bus, None, old, snap.index, "b <b@x>")
    if tip is None:
        return 0
    maps = L.write_maps(bus, tip)
    lines = [f"update {L.LEDGER_REF} {tip}"] + [f"update {L.map_ref(k)} {b}" for k, b in maps.items()]
    lease = L.lease_commit(
        bus, "bench", utcnow() + dt.timedelta(minutes=5), "b <b@x>"
    )  # as a compaction leaves
    lines += [f"update {L.LEASE_REF} {lease}"] + [f"delete {done_ref(e.id)}" for e in old]
    lines += [f"delete {subject_ref(snap.index[e.id][0], e.id)}" for e in old if e.id in snap.index]
    G.run(bus, "update-ref", "--stdin", input="".join(line + "\n" for line in lines).encode())
    return len(old)


class ClaimWatch:
    """Notes when the claim ref of request `rid` appears in the bus repository `bus` (a loose ref file, looked at
    every 2 ms from a thread: nothing on the wire): `with ClaimWatch(bus, rid) as seen: ...`, then `seen.at`
    (time.perf_counter() of the first sight, or None)."""

    def __init__(self, bus: Path, rid: str):
        self.path, self.at = bus / claim_ref(rid), None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._look, daemon=True)

    def _look(self) -> None:
        while not self.stop.is_set():
            if self.path.exists():
                self.at = time.perf_counter()
                return
            time.sleep(0.002)

    def __enter__(self) -> ClaimWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def pickup_watch(runner: Any, url: str, project: Path, env: dict[str, str], bus: Path, work: Path) -> dict:
    """A request picked up by `runner` (a bridge.run.runner.Runner) watching at a 0.5 s poll in a thread:
    `request_to_claim_s` from `kakeya request` returning to the claim on the bus (poll wait included), and
    `poll_to_claim_s`, the runner's own part: from the start of the poll that found it to the claim."""
    starts: list[float] = []
    serve_one = runner.serve_one

    def timed(*args: Any, **kw: Any) -> Any:
        starts.append(time.perf_counter())
        return serve_one(*args, **kw)

    runner.serve_one = timed
    runner.stopping.clear()
    thread = threading.Thread(target=runner.watch, kwargs={"poll_s": 0.5}, daemon=True)
    thread.start()
    try:
        time.sleep(1.0)  # the watcher is polling
        proc = sh(*kakeya("request", "bench", "--runner", "cpu", "--remote", url), cwd=project, env=env)
        rid = proc.stdout.strip()
        asked = time.perf_counter()
        with ClaimWatch(bus, rid) as seen:
            deadline = time.monotonic() + 60
            while seen.at is None and time.monotonic() < deadline:
                time.sleep(0.01)
        while not (bus / done_ref(rid)).exists() and time.monotonic() < deadline + 60:
            time.sleep(0.05)
    finally:
        runner.stop("measured")
        thread.join(60)
        runner.serve_one = serve_one
    if seen.at is None:
        return {"error": f"no claim of {rid} within 60 s"}
    poll = max((t for t in starts if t <= seen.at), default=None)
    return {
        "request_to_claim_s": round(seen.at - asked, 3),
        "poll_to_claim_s": round(seen.at - poll, 3) if poll is not None else None,
    }


def retry(call: Callable[[], object]) -> None:
    """`call()`, once more when the test HTTP server dropped a connection under load."""
    from bridge.core.errors import BusError

    try:
        call()
    except BusError as exc:
        if "Empty reply from server" not in str(exc):
            raise
        call()


def bench_project(work: Path) -> tuple[Path, dict[str, str]]:
    """The project every bus benchmark requests runs of (work/project: the probe program, one commit on main)
    and the environment of its commands (the `bench` preset of work/presets, a runner name, a committer)."""
    import yaml

    project, presets = work / "project", work / "presets"
    presets.mkdir(parents=True)
    (presets / "bench.yaml").write_text(yaml.safe_dump(PRESET))
    project.mkdir()
    (project / "bench_program.py").write_text(PROGRAM)
    (project / ".gitignore").write_text("/out/\n/.kakeya/\n")
    env = {
        # bytecode cached, as an installed kakeya has it (a sandbox's PYTHONDONTWRITEBYTECODE would make every
        # command compile all of its modules again: about half a second under load)
        **{
            k: v
            for k, v in os.environ.items()
            if not k.startswith("KAKEYA_") and k != "PYTHONDONTWRITEBYTECODE"
        },
        "KAKEYA_PRESETS": str(presets),
        "KAKEYA_RUNNER_NAME": "bench",
        "GIT_AUTHOR_NAME": "B",
        "GIT_AUTHOR_EMAIL": "b@x",
        "GIT_COMMITTER_NAME": "B",
        "GIT_COMMITTER_EMAIL": "b@x",
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
    }
    for args in (("init", "-q", "-b", "main"), ("add", "-A"), ("commit", "-qm", "project")):
        sh("git", *args, cwd=project, env=env)
    return project, env


def measure_size(
    work: Path,
    size: int,
    transport: str = "git",
    per_day: float = 100,
    migrate: str = "runners",
    gate_repeats: int = 5,
) -> dict[str, Any]:
    """Every operation on a bus of `size` finished requests made at `per_day` a day (so the history spans
    size / per_day days, and the runners' compaction window of 2 days holds about 2 * per_day of them), served
    over `transport`: {op: {"bytes", "bytes_down", "seconds", "rc"}}."""

    served = work / "served"
    bus = G.init_bare(served / "bus.git")
    G.run(bus, "config", "http.receivepack", "true")
    G.run(bus, "config", "uploadpack.allowFilter", "true")  # as GitHub and GitLab do (docs/bus.md)
    project, env = bench_project(work)
    sh("git", "push", "-q", str(bus), "main", cwd=project, env=env)
    out: dict[str, Any] = {
        "transport": transport,
        "per_day": per_day,
        "history_days": round(size / per_day, 1),
    }
    with serve(served, transport) as (url, relay):

        def op(name: str, *argv: str, cwd: Path = project) -> subprocess.CompletedProcess[str]:
            for _attempt in range(2):  # the test HTTP server under load: a dropped connection, once
                relay.reset()
                t0, cpu0 = time.perf_counter(), children_cpu()
                proc = sh(*argv, cwd=cwd, env=env)
                if proc.returncode == 0 or "Empty reply from server" not in proc.stderr:
                    break
                out.setdefault("retried", []).append(name)
            out[name] = {
                "bytes": relay.up + relay.down,
                "bytes_down": relay.down,
                "seconds": round(time.perf_counter() - t0, 3),
                "cpu_s": round(children_cpu() - cpu0, 3),
                "rc": proc.returncode,
            }
            if proc.returncode != 0:
                out[name]["output"] = (proc.stdout + proc.stderr)[-300:]
            return proc

        # one real run: the template of the history
        rid = sh(*kakeya("request", "bench", "--runner", "cpu", "--remote", url), cwd=project, env=env)
        real = rid.stdout.strip()
        sh(*kakeya("runner", "once", "--labels", "cpu", "--remote", url), cwd=project, env=env)
        t0 = time.perf_counter()
        tpl = template(bus, G.refs_under(bus, DONE_PREFIX)[done_ref(real)])
        made = write_history(bus, tpl, size - 1, days=size / per_day)
        out["write_history_s"] = round(time.perf_counter() - t0, 2)
        out["refs_on_bus_before_compaction"] = len(G.refs_under(bus, "refs/"))
        # the first automatic compaction: a runner with nothing to serve finds done results older than its
        # window (compact_after_days, 2) and moves them into the ledger (what upgrading a bus costs once)
        runner = ("runner", "once", "--labels", "cpu", "--name", "bench", "--remote", url)
        total = {"bytes": 0, "bytes_down": 0, "seconds": 0.0, "rc": 0, "rounds": 0}
        if migrate == "in-place":
            t0 = time.perf_counter()
            out["migrated_in_place"] = compact_in_place(bus, utcnow() - dt.timedelta(days=2))
            out["migrated_in_place_s"] = round(time.perf_counter() - t0, 2)
        cutoff = id_time(made["ids"][-1]) - dt.timedelta(days=2.1)  # what the runners' window moves
        while total["rounds"] < 40:  # a runner moves up to 1,000 at a time: `runner once` until none is left
            if not any(id_time(ref.rsplit("/", 1)[1]) < cutoff for ref in G.refs_under(bus, DONE_PREFIX)):
                break
            proc = op("compaction_round", *kakeya(*runner))
            step = out.pop("compaction_round")
            total = {k: (round(v + step[k], 3) if k in step and k != "rc" else v) for k, v in total.items()}
            total["rc"] = max(total["rc"], step["rc"])
            total["rounds"] += 1
            total["log"] = [ln for ln in proc.stderr.splitlines() if "compact" in ln][-3:]
        out["compaction_first"] = total
        out["refs_on_bus"] = len(G.refs_under(bus, "refs/"))
        for kind in (
            "date",
            "subject",
            "preset",
        ):  # the ledger's maps: what a reader of the ledger fetches first
            size_of = G.run(
                bus, "cat-file", "-s", f"refs/kakeya/ledger-map/{kind}", check=False
            ).stdout.strip()
            out[f"ledger_map_{kind}_bytes"] = int(size_of or 0)
        op("poll", *kakeya(*runner))  # the mirror is warm now: an idle runner once
        os.environ.update({k: env[k] for k in ("KAKEYA_PRESETS", "KAKEYA_RUNNER_NAME")})
        from bridge.config import load_config
        from bridge.run.runner import Runner

        watcher = Runner(
            url, config=load_config(project), name="watcher", labels=["cpu"], workdir=work / "w1"
        )
        retry(watcher.once)  # its first look at compacting is here; the next is compact_every_s later
        relay.reset()
        t0 = time.perf_counter()
        retry(watcher.once)  # one poll of `runner watch` (no presence push: that is every 2 leases)
        out["poll_watch"] = {"bytes": relay.up + relay.down, "seconds": round(time.perf_counter() - t0, 3)}
        new = op("request", *kakeya("request", "bench", "--runner", "cpu", "--remote", url)).stdout.strip()
        with ClaimWatch(bus, new) as seen:
            t0 = time.perf_counter()
            op("pickup", *kakeya(*runner))
        out["pickup"]["claim_s"] = round(seen.at - t0, 3) if seen.at else None
        # a watching runner (in this process, polling every 0.5 s as `runner watch --poll 0.5`): from the
        # moment `kakeya request` returns to the claim on the bus, and the runner's own part of that (its poll
        # that found the request: listing, fetch, claim commit, claim push)
        out["pickup_watch"] = pickup_watch(watcher, url, project, env, bus, work)
        op("wait", *kakeya("wait", new, "--remote", url, "--out", str(work / "w")))
        op("status", *kakeya("status", "--remote", url))
        op("status_all", *kakeya("status", "--all", "--remote", url))
        op("runners", *kakeya("runners", "--remote", url))
        recent, oldest = made["ids"][-1], made["ids"][0]
        op("results_recent", *kakeya("results", recent, "--remote", url, "--out", str(work / "r")))
        op("results_from_ledger", *kakeya("results", oldest, "--remote", url, "--out", str(work / "l")))
        # subjects of 1 and 50 runs from the start of the history (in the ledger), and the newest (in refs)
        subjects = {f"{runs}_runs": subject for runs, subject in made["subjects"].items()}
        newest = json.loads(
            G.read_path(bus, G.refs_under(bus, DONE_PREFIX)[done_ref(recent)], MANIFEST_PATH) or b"{}"
        )
        subjects["recent"] = newest["subject"]
        for what, subject in sorted(subjects.items()):
            gate = kakeya(
                "gate",
                "pr",
                "--subject",
                subject,
                "--require",
                "bench@cpu",
                "--remote",
                url,
                "--allow-unsigned",
            )
            cold = []
            for i in range(gate_repeats):  # each in a fresh depth-1 clone: the median and the slowest
                ci = work / f"ci-{what}-{i}"
                sh("git", "clone", "-q", "--depth", "1", url, str(ci), cwd=work, env=env)
                op(f"gate_cold_{what}", *gate, cwd=ci)
                cold.append(out[f"gate_cold_{what}"])
            out[f"gate_cold_{what}"] = {
                **cold[0],
                "seconds": statistics.median(c["seconds"] for c in cold),
                "cpu_s": statistics.median(c["cpu_s"] for c in cold),
                "seconds_max": max(c["seconds"] for c in cold),
                "runs": len(cold),
                "rc": max(c["rc"] for c in cold),
            }
            op(f"gate_warm_{what}", *gate, cwd=ci)
        op("clone", "git", "clone", "-q", url, str(work / "teammate"), cwd=work)
        op("fetch_noop", "git", "fetch", "-q", cwd=work / "teammate")
        op("compact_noop", *kakeya("bus", "compact", "--older-than", "2", "--remote", url))
        op("gc", *kakeya("bus", "gc", "--older-than", "30", "--remote", url))
        out["refs_on_bus_at_end"] = len(G.refs_under(bus, "refs/"))
    return out


def growth(small: dict[str, Any], large: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Each operation's cost at the larger size over its cost at the smaller (the target: within 2x)."""
    return {
        name: {
            "bytes": round(large[name]["bytes"] / max(small[name]["bytes"], 1), 2),
            "seconds": round(large[name]["seconds"] / max(small[name]["seconds"], 1e-3), 2),
            **(
                {"cpu_s": round(large[name]["cpu_s"] / max(small[name]["cpu_s"], 1e-3), 2)}
                if "cpu_s" in small[name] and "cpu_s" in large[name]
                else {}
            ),
        }
        for name in small
        if isinstance(small[name], dict) and "bytes" in small[name] and name in large
    }


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes", default="100,1000,10000", help="finished requests per bus (comma-separated)"
    )
    parser.add_argument(
        "--transports", default="git,http", help="git (git daemon) and/or http (http-backend)"
    )
    parser.add_argument("--per-day", type=float, default=100, help="finished requests a day in the history")
    parser.add_argument(
        "--migrate",
        choices=("runners", "in-place"),
        default="runners",
        help="how the history gets into the ledger: the runners' own compaction (measured), or written straight "
        "into the bus (compact_in_place: the steady state in seconds)",
    )
    parser.add_argument(
        "--gate-repeats",
        type=int,
        default=5,
        help="cold `gate pr` runs per subject (median and slowest kept)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "bus_scale.json")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    transports = args.transports.split(",")
    load_before = harness.load_average()
    result: dict[str, Any] = {"command": harness.command("bus_scale"), "sizes": {}}
    result["growth"] = {}
    for transport in transports:
        runs = result["sizes"].setdefault(transport, {})
        for size in sizes:
            work = Path(tempfile.mkdtemp(prefix=f"kakeya-bus-scale-{transport}-{size}-"))
            t0 = time.perf_counter()
            try:
                runs[str(size)] = measure_size(
                    work, size, transport, args.per_day, args.migrate, args.gate_repeats
                )
            finally:
                shutil.rmtree(work, ignore_errors=True)
            runs[str(size)]["load_avg_after"] = harness.load_average()
            runs[str(size)]["measured_s"] = round(time.perf_counter() - t0, 1)
            print(json.dumps({transport: {size: runs[str(size)]}}), flush=True)
        result["growth"][transport] = growth(runs[str(sizes[0])], runs[str(sizes[-1])])
        if len(sizes) > 2:  # from the first size whose history fills the runners' window (2 days) on
            result.setdefault("growth_window_full", {})[transport] = growth(
                runs[str(sizes[1])], runs[str(sizes[-1])]
            )
    result["environment"] = harness.environment(load_before)
    harness.write_json(args.out, result)
    print(json.dumps(result["growth"], indent=2))


if __name__ == "__main__":
    main()
