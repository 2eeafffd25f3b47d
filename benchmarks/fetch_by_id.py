"""One object fetched by id from a git daemon on loopback: `git fetch` (bridge/wire/git.py `fetch`) against
bridge/wire/upload_pack.py `daemon_fetch` (protocol v2 on a socket of our own, TCP_NODELAY and TCP_QUICKACK), side by
side. Not a test: it measures, and asserts only that each fetch brought what it asked for.

    python benchmarks/fetch_by_id.py --out benchmarks/results/fetch_by_id.json

One `git daemon` (uploadpack.allowFilter on) serving a blob (a ledger map's size) and a tree of `--entries`
subdirectories (a ledger shard); `--n` rounds, each fetching the blob, then the tree with tree:0, by either
method in turn, each into a fresh bare store. Wall seconds per fetch (median and max), under the host's load
(`/proc/loadavg` before and after).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bridge.wire import git as G  # noqa: E402
from bridge.wire import transport as T  # noqa: E402
from bridge.wire import upload_pack as UP  # noqa: E402
from tests.bridge.bus_support import Daemon  # noqa: E402


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
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/fetch_by_id.json")
    args = parser.parse_args()
    report: dict[str, Any] = {
        "what": "wall seconds of one fetch by object id from git daemon on 127.0.0.1, each into a fresh store",
        "command": "python " + " ".join(sys.argv),
        "git": G.version(),
        "n": args.n,
        "loadavg_before": Path("/proc/loadavg").read_text().strip(),
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
    report["loadavg_after"] = Path("/proc/loadavg").read_text().strip()
    report["results"] = {
        name: {
            method: {"median_s": round(statistics.median(ts), 4), "max_s": round(max(ts), 4)}
            for method, ts in by.items()
        }
        for name, by in times.items()
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["results"], indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
