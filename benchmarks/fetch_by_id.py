"""One object fetched by id from a git daemon on loopback: `git fetch` (bridge/wire/git.py `fetch`) against
bridge/wire/upload_pack.py `daemon_fetch` (protocol v2 on a socket of our own, TCP_NODELAY and TCP_QUICKACK), side by
side. Not a test: it measures, and asserts only that each fetch brought what it asked for.

    python -m benchmarks.fetch_by_id --out benchmarks/results/fetch_by_id.json

One `git daemon` (uploadpack.allowFilter on) serving a blob (a ledger map's size) and a tree of `--entries`
subdirectories (a ledger shard); `--n` rounds, each fetching the blob, then the tree with tree:0, by either
method in turn, each into a fresh bare store. Wall seconds per fetch (median and max), under the host's load
(the environment's load average before and after).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.harness import RESULTS
from bridge.wire import git as G
from bridge.wire import transport as T
from bridge.wire import upload_pack as UP
from tests.bridge.bus_support import Daemon


def git_fetch(store: Path, url: str, sha: str, tree_filter: str | None) -> None:
    if (msg := T.for_url(url).fetch(store, [sha], 30, tree_filter=tree_filter)) is not None:
        raise SystemExit(f"git fetch failed: {msg}")


def daemon_fetch(store: Path, url: str, sha: str, tree_filter: str | None) -> None:
    UP.daemon_fetch(store, url, [sha], 30, tree_filter)


METHODS = {"git_fetch": git_fetch, "daemon_fetch": daemon_fetch}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--entries", type=int, default=256)
    parser.add_argument("--out", type=Path, default=RESULTS / "fetch_by_id.json")
    args = parser.parse_args()
    load_before = harness.load_average()
    report: dict[str, Any] = {
        "what": "wall seconds of one fetch by object id from git daemon on 127.0.0.1, each into a fresh store",
        "command": harness.command("fetch_by_id"),
        "git": G.version(),
        "n": args.n,
    }
    with tempfile.TemporaryDirectory(prefix="fetch-by-id-") as tmp:
        base = Path(tmp)
        daemon = Daemon(base / "served")
        url = daemon.repo()
        bus = base / "served" / "bus.git"
        G.run(bus, "config", "uploadpack.allowFilter", "true")
        blob = G.write_blobs(bus, [json.dumps({"shards": {f"s{i}": "0" * 40 for i in range(40)}}).encode()])[
            0
        ]
        leaves = G.write_blobs(bus, [f"entry {i}\n".encode() for i in range(args.entries)])
        dirs = [G.out(bus, "mktree", input=f"100644 blob {b}\tentry.json\n".encode()) for b in leaves]
        tree = G.out(
            bus, "mktree", input="".join(f"040000 tree {d}\t{i:04x}\n" for i, d in enumerate(dirs)).encode()
        )
        objects = {"blob": (blob, None), "tree_tree0": (tree, "tree:0")}
        times: dict[str, dict[str, list[float]]] = {o: {m: [] for m in METHODS} for o in objects}
        daemon.start()
        try:
            for i in range(args.n):
                for name, (sha, tree_filter) in objects.items():
                    for method, fetch in METHODS.items():
                        store = G.init_bare(base / f"store-{i}-{name}-{method}.git")
                        start = time.perf_counter()
                        fetch(store, url, sha, tree_filter)
                        times[name][method].append(time.perf_counter() - start)
                        if G.present(store, [sha]) != {sha}:
                            raise SystemExit(f"{method} did not bring {name} {sha}")
        finally:
            daemon.stop()
    report["results"] = {
        name: {
            method: {"median_s": round(statistics.median(ts), 4), "max_s": round(max(ts), 4)}
            for method, ts in by.items()
        }
        for name, by in times.items()
    }
    report["environment"] = harness.environment(load_before)
    harness.write_json(args.out, report)
    print(json.dumps(report["results"], indent=2))


if __name__ == "__main__":
    main()
