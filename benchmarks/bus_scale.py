"""The bus at a team's scale (issue 27): what each hot path costs, in bytes on the wire and seconds, on buses
holding 100, 1,000 and 10,000 finished requests. Not a test: it measures, it asserts nothing.

    python benchmarks/bus_scale.py --sizes 100,1000,10000 --out benchmarks/results/bus_scale.json

Each bus starts from a real run (a `kakeya runner` serves a real request over `git daemon`); its done
result is the template of the history, written with one `git fast-import` in exactly the shape real runs
leave (`write_history`: request commit on the subject, claim commit, done commit with the same files, a done
ref and a by-subject index ref; no request or claim ref), spread over subjects of 1 and of 50 runs.
tests/bridge/test_bus_layout.py checks those shapes against a real run. Every command talks to `git daemon`
through `Relay`, a TCP relay that counts the bytes each way.

  poll         an idle `runner once` (nothing to do)
  request      `kakeya request` (one new live request)
  pickup       `runner once` that claims, runs and pushes that request (seconds: the whole serve)
  wait         one look of `kakeya wait` at a finished request (the listing and the done commit)
  status       `kakeya status` (live + recent)
  runners      `kakeya runners`
  results      `kakeya results ID` into a fresh clone
  gate_cold    `kakeya gate pr` in a fresh depth-1 clone (as pr-gate.yml runs it), subject with 1 / 50 runs
  gate_warm    the same again in the same clone
  clone        a teammate's `git clone` of the bus and a no-op `git fetch`
  gc           `kakeya bus gc --older-than 30`

Growth per operation = its cost at the largest size / at the smallest (the target: within 2x).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import secrets
import socket
import sys
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bridge import bus as B  # noqa: E402
from bridge import git as G  # noqa: E402

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
            upstream = socket.create_connection(("127.0.0.1", self.target))
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
    manifest = json.loads(G.read_path(bus, done, B.MANIFEST_PATH) or b"{}")
    subject, rid = manifest["subject"], manifest["id"]
    chain = chain[: chain.index(subject)]
    results = G.read_dir(bus, done, B.results_path(rid))
    return {
        "id": rid,
        "subject": subject,
        "depth": len(chain),  # done, the claim commits, the request
        "request": G.read_path(bus, chain[-1], B.MANIFEST_PATH),
        "claim": G.read_path(bus, done, B.CLAIM_PATH),
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


def write_history(
    bus: Path, tpl: dict[str, Any], count: int, runs_per_subject: tuple[int, ...] = (1, 50)
) -> dict[str, Any]:
    """`count` finished requests like the template, written with `git fast-import`: per request a request
    commit on its subject, a claim commit and a done commit with the template's files (its id and subject
    replaced), a done ref and a by-subject index ref, and no request or claim ref (as a done push leaves it).
    The subjects are new commits on the template's subject: the first get `runs_per_subject` runs each, every
    other request a subject of its own. Ids are spread over the last 30 days, oldest first.
    Returns {"subjects": {runs: subject sha}, "ids": [...]}."""
    now = B.utcnow().replace(microsecond=0)
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
        rid = B.new_id(B.id_preset(tpl["id"]), now - dt.timedelta(seconds=30 * 86400 * (count - i) / count))
        ids.append(rid)

        def swap(data: bytes, rid: str = rid, subject: str = subject) -> bytes:
            return data.replace(old_id, rid.encode()).replace(old_subject, subject.encode())

        tmp = "refs/kakeya-import/tmp"
        req = _commit(
            stream,
            mark + 1,
            tmp,
            subject,
            {B.MANIFEST_PATH: swap(tpl["request"])},
            f"kakeya request {rid}",
            when,
        )
        claim = _commit(
            stream, mark + 2, tmp, req, {B.CLAIM_PATH: swap(tpl["claim"])}, f"kakeya claims {rid}", when
        )
        files = {f"{B.results_path(rid)}/{p}": swap(d) for p, d in tpl["results"].items()}
        done = _commit(stream, mark + 3, tmp, claim, files, f"kakeya done {rid}", when)
        mark += 3
        stream.append(f"reset {B.done_ref(rid)}\nfrom {done}\n\n".encode())
        stream.append(f"reset {B.subject_ref(subject, rid)}\nfrom {done}\n\n".encode())
    G.run(bus, "fast-import", "--quiet", "--force", input=b"".join(stream))
    G.run(
        bus,
        "update-ref",
        "--stdin",
        input="".join(f"delete {ref}\n" for ref in G.refs_under(bus, "refs/kakeya-import/")).encode(),
    )
    return {"subjects": {runs: subjects[i] for i, runs in enumerate(runs_per_subject)}, "ids": ids}
