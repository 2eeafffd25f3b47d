"""Mass leased deletion on a large bus (issue 27): `git push --atomic --force-with-lease` (bridge/wire/git.py `push`)
against bridge/wire/receive_pack.py, side by side. Not a test: it measures, it asserts only that each push deleted
what it was asked to.

    python -m benchmarks.bus_delete --out benchmarks/results/bus_delete.json

A bus of `--refs` refs (written with one `git update-ref --stdin`); for each N of `--deletions`, one atomic push
deleting N of them, each leased on its sha, over git:// (`git daemon`) and a local path; the refs deleted are
written back between pushes. `cpu_s` is the client's CPU (this process and its finished children: git push and
what it starts; for a local bus that includes the bus's git-receive-pack, which either method starts here; over
git:// the daemon's receive-pack is not counted for either); `wall_s` is wall time under the host's load
(the environment's load average before and after).
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.harness import RESULTS
from bridge.wire import git as G
from bridge.wire import receive_pack as RP
from bridge.wire import transport as T
from tests.bridge.bus_support import Daemon

ENV = {
    "GIT_AUTHOR_NAME": "b",
    "GIT_AUTHOR_EMAIL": "b@x",
    "GIT_COMMITTER_NAME": "b",
    "GIT_COMMITTER_EMAIL": "b@x",
}
METHODS: dict[str, Callable[..., tuple[T.Status, str | None]]] = {
    "git_push": lambda store, url, *a: T.for_url(url).push(store, *a),
    "receive_pack": RP.push,
}


def cpu() -> float:
    """CPU seconds (user + system) of this process and its finished children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def fill(bus: Path, refs: list[str], sha: str) -> None:
    """Create (or reset) `refs` on `bus` at `sha`, in one `git update-ref --stdin` transaction."""
    G.run(bus, "update-ref", "--stdin", input="".join(f"update {r} {sha}\n" for r in refs).encode())


def measure(
    store: Path, bus: Path, url: str, refs: list[str], sha: str, n: int, method: str
) -> dict[str, Any]:
    doomed = refs[:n]
    fill(bus, refs, sha)
    before, t0 = cpu(), time.perf_counter()
    status, error = METHODS[method](store, url, [(r, None, sha) for r in doomed], True, 3600)
    wall, used = time.perf_counter() - t0, cpu() - before
    left = G.refs_under(bus, "refs/kakeya/")
    ok = error is None and all(status.get(r, (False, ""))[0] for r in doomed) and len(left) == len(refs) - n
    if not ok:
        raise SystemExit(f"{method} over {url}: {n} deletions did not all land: {error}")
    return {"method": method, "deletions": n, "wall_s": round(wall, 3), "cpu_s": round(used, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refs", type=int, default=20_000)
    parser.add_argument("--deletions", default="250,1000,4000")
    parser.add_argument("--transports", default="git,local")
    parser.add_argument("--out", type=Path, default=RESULTS / "bus_delete.json")
    args = parser.parse_args()
    sizes = [int(x) for x in args.deletions.split(",")]
    load_before = harness.load_average()
    report: dict[str, Any] = {
        "what": "one atomic push of N leased deletions on a bus of `refs` refs: git push vs receive_pack",
        "command": harness.command("bus_delete"),
        "git": G.version(),
        "refs": args.refs,
        "results": {},
    }
    with tempfile.TemporaryDirectory(prefix="bus-delete-") as tmp:
        base = Path(tmp)
        store = G.init_bare(base / "store.git")
        for transport in args.transports.split(","):
            daemon = Daemon(base / "served") if transport == "git" else None
            bus = G.init_bare(base / "served" / f"{transport}.git")
            sha = G.out(bus, "commit-tree", G.out(bus, "mktree", input=b""), "-m", "bench", env=ENV)
            refs = [f"refs/kakeya/done/20260101T000000.000Z-bench-{i:06x}" for i in range(args.refs)]
            url = str(bus)
            if daemon is not None:
                daemon.start()
                url = f"git://127.0.0.1:{daemon.port}/{bus.name}"
            rows = []
            try:
                for n in sizes:
                    for method in METHODS:
                        rows.append(measure(store, bus, url, refs, sha, n, method))
                        print(json.dumps({"transport": transport, **rows[-1]}), flush=True)
            finally:
                if daemon is not None:
                    daemon.stop()
            report["results"][transport] = rows
    report["speedup_cpu"] = {
        f"{t}/{n}": round(
            next(r["cpu_s"] for r in rows if r["deletions"] == n and r["method"] == "git_push")
            / max(
                next(r["cpu_s"] for r in rows if r["deletions"] == n and r["method"] == "receive_pack"), 1e-3
            ),
            1,
        )
        for t, rows in report["results"].items()
        for n in sizes
    }
    report["environment"] = harness.environment(load_before)
    harness.write_json(args.out, report)


if __name__ == "__main__":
    main()
