"""The bus over smart HTTP (`git http-backend` behind a local HTTP server, fixture `httpgit`): the whole
protocol end to end, listings scoped by protocol v2 through git's own remote helper, the fallback for a
server that speaks only v0, and servers that fail, hang or lie."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from bridge.bus.bus import Bus, BusUnreachable
from bridge.bus.records import (
    CLAIM_PREFIX,
    DONE_PREFIX,
    REQ_PREFIX,
    SUBJECT_PREFIX,
    claim_ref,
    done_ref,
    req_ref,
    subject_ref,
)
from bridge.cli.main import main
from bridge.wire import git as G
from bridge.wire import transport as T
from bridge.wire.pktline import pkt
from tests.bridge.bus_support import Env, HttpGit, git, make_runner


def test_request_run_and_gate_over_http(world: Env, httpgit: HttpGit, capsys):
    url = httpgit.repo()
    bus_dir = httpgit.base / "bus.git"
    head = git(world.project, "rev-parse", "HEAD")
    assert main(["request", "work", "--runner", "cpu", "--remote", url]) == 0
    rid = capsys.readouterr().out.strip().splitlines()[-1]
    assert req_ref("cpu", rid) in G.refs_under(bus_dir, "refs/")
    done = make_runner(url, world).once()
    assert done is not None and done.pushed and done.id == rid
    refs = G.refs_under(bus_dir, "refs/")
    assert refs[done_ref(rid)] == refs[subject_ref(head, rid)] == done.done
    assert req_ref("cpu", rid) not in refs and claim_ref(rid) not in refs
    assert main(["wait", rid, "--remote", url]) == 0
    capsys.readouterr()
    gate = ["gate", "pr", "--subject", head, "--require", "work@cpu", "--remote", url, "--allow-unsigned"]
    assert main(gate) == 0
    assert capsys.readouterr().out.startswith(f"✓ work@cpu: pass — {rid}")
    assert main(["results", rid, "--remote", url, "--out", str(world.tmp / "res")]) == 0
    assert (world.tmp / "res" / rid / "result.json").is_file()
    # the listing asked the server for the prefix only, and it is exactly what a full listing filters to
    full = git(world.project, "ls-remote", url)
    scoped = T.for_url(url).ls_refs(world.project, [DONE_PREFIX, SUBJECT_PREFIX], 60)
    assert scoped == "".join(
        ln + "\n" for ln in full.splitlines() if ln.split("\t")[1].startswith((DONE_PREFIX, SUBJECT_PREFIX))
    )
    assert scoped.count("\n") == 2


def test_a_server_of_protocol_v0_gets_the_full_listing_said_once(world: Env, tmp_path, capsys):
    old = HttpGit(tmp_path / "v0", v2=False)
    try:
        url = old.repo()
        make_runner(url, world)  # nothing on the bus yet: a request makes its refs
        assert main(["request", "work", "--runner", "cpu", "--remote", url]) == 0
        said = capsys.readouterr()
        rid = said.out.strip().splitlines()[-1]
        for _ in range(2):
            listed = T.for_url(url).ls_refs(world.project, [REQ_PREFIX], 60)
            assert listed.splitlines() == [
                f"{G.refs_under(old.base / 'bus.git', 'refs/')[req_ref('cpu', rid)]}\t{req_ref('cpu', rid)}"
            ]
        assert (said.err + capsys.readouterr().err).count("speaks only git protocol v0/v1") == 1
        done = make_runner(url, world).once()
        assert done is not None and done.pushed  # the protocol still works, on full listings
    finally:
        old.stop()


class Liar:
    """An HTTP server that claims protocol v2 and answers `answer` to every command (or never answers)."""

    def __init__(self, answer: bytes | None):
        outer = self
        self.served = threading.Event()

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def _send(self, kind: str, body: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", f"application/x-git-upload-pack-{kind}")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if answer is None:
                    outer.served.wait(30)
                    return
                self._send("advertisement", pkt("version 2\n") + pkt("ls-refs\n") + b"0000")

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._send("result", answer or b"")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/bus.git"

    def close(self) -> None:
        self.served.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(name="liar")
def liar_fixture(request: pytest.FixtureRequest) -> Iterator[Liar]:
    liar = Liar(request.param)
    yield liar
    liar.close()


SHA = "a" * 40


@pytest.mark.parametrize(
    ("liar", "error"),
    [
        (pkt(f"{SHA} refs/kakeya/done/x\n"), "cut short"),  # the answer ends before its flush
        (pkt(f"{SHA} refs/kakeya/done/x\n")[:20], "cut short"),  # and half-way through a packet
        (pkt("ERR go away\n"), "go away"),
        (b"zzzz", "malformed packet|bad line length"),
        (None, "timed out after 2 s"),  # the server never answers
    ],
    indirect=["liar"],
)
def test_a_lying_or_silent_http_server_never_yields_a_partial_list(world: Env, liar: Liar, error: str):
    with pytest.raises(BusUnreachable, match=f"listing refs/kakeya/done/.*({error})"):
        Bus(liar.url, world.project, timeout_s=2).list([DONE_PREFIX])


def test_http_errors_say_what_went_wrong(world: Env, httpgit: HttpGit):
    httpgit.repo()
    missing = f"http://127.0.0.1:{httpgit.port}/nope.git"
    with pytest.raises(BusUnreachable, match=r"listing refs/kakeya/claim/.*nope.git.*not found"):
        Bus(missing, world.project).list([CLAIM_PREFIX])
    with pytest.raises(BusUnreachable, match="Failed to connect"):
        Bus("http://127.0.0.1:1/bus.git", world.project).list([CLAIM_PREFIX])
