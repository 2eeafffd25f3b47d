"""The bus over ssh (a real OpenSSH sshd on 127.0.0.1 with a generated host key, in a temporary directory):
a listing asks for its prefixes only (protocol v2, GIT_PROTOCOL sent with SendEnv) where the sshd accepts
GIT_PROTOCOL, and falls back to the full list, filtered and said once, where it does not; kakeya's commands work
over ssh either way."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.bus_scale import Relay, template, write_history
from bridge.bus.records import CLAIM_PREFIX, DONE_PREFIX, done_ref, runner_ref
from bridge.cli.main import main
from bridge.wire import git as G
from bridge.wire import transport as T
from tests.bridge.bus_support import Env, free_port, git, make_runner

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
pytestmark = pytest.mark.skipif(
    not Path(SSHD).is_file() or os.geteuid() != 0,
    reason="needs OpenSSH's sshd (Debian: openssh-server; `make test` installs it as root) and root to start it",
)


class Sshd:
    """An sshd on 127.0.0.1:`port` that lets this user in with a generated key; `accept_env`: whether it
    accepts GIT_PROTOCOL (OpenSSH's AcceptEnv), as GitHub's and GitLab's do and a stock Debian sshd does not."""

    def __init__(self, base: Path, accept_env: bool):
        base.mkdir(parents=True)
        self.base, self.port = base, free_port()
        for name in ("host", "user"):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(base / name)], check=True
            )
        (base / "authorized_keys").write_text((base / "user.pub").read_text())
        config = [
            f"Port {self.port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {base / 'host'}",
            f"AuthorizedKeysFile {base / 'authorized_keys'}",
            "StrictModes no",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "UsePAM no",
            f"PidFile {base / 'sshd.pid'}",
            *(["AcceptEnv GIT_PROTOCOL"] if accept_env else []),
        ]
        (base / "sshd_config").write_text("\n".join(config) + "\n")
        Path("/run/sshd").mkdir(exist_ok=True)  # its privilege separation directory
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(base / "sshd_config")],
            stderr=(base / "sshd.log").open("wb"),
        )
        self.command = (
            f"ssh -i {base / 'user'} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
            "-o BatchMode=yes -o LogLevel=ERROR"
        )
        deadline = time.monotonic() + 20
        while subprocess.run(
            [*self.command.split(), "-p", str(self.port), "127.0.0.1", "true"], capture_output=True
        ).returncode:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"sshd did not start: {(base / 'sshd.log').read_text()}")
            time.sleep(0.2)

    def url(self, bus: Path, port: int | None = None) -> str:
        return f"ssh://{os.environ.get('USER', 'root')}@127.0.0.1:{port or self.port}{bus}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture(name="sshd", params=[True, False], ids=["accept-env", "stock"])
def sshd_fixture(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch) -> Iterator[Sshd]:
    server = Sshd(tmp_path / "sshd", request.param)
    monkeypatch.setenv("GIT_SSH_COMMAND", server.command)
    yield server
    server.stop()


def test_a_listing_over_ssh_asks_only_for_its_prefixes(world: Env, sshd: Sshd, capsys):
    bus_dir = G.init_bare(world.tmp / "bus.git")
    url = sshd.url(bus_dir)
    accepts = "AcceptEnv" in (sshd.base / "sshd_config").read_text()
    rid = main(["request", "work", "-p", "tag=ssh", "--runner", "cpu", "--remote", url])
    assert rid == 0
    rid_text = capsys.readouterr().out.strip().splitlines()[-1]
    served = make_runner(url, world).once()
    assert served is not None and served.pushed and served.id == rid_text
    write_history(bus_dir, template(bus_dir, G.refs_under(bus_dir, DONE_PREFIX)[done_ref(served.id)]), 300)
    relay = Relay(sshd.port)
    try:
        relayed = sshd.url(bus_dir, relay.port)
        relay.reset()
        claims = T.for_url(relayed).ls_refs(world.project, [CLAIM_PREFIX, runner_ref("x")], 60)
        few = relay.down
        relay.reset()
        done = T.for_url(relayed).ls_refs(world.project, [DONE_PREFIX], 60)
        many = relay.down
    finally:
        relay.close()
    assert claims == ""
    assert len(done.splitlines()) == 301 and all(
        ln.split("\t")[1].startswith(DONE_PREFIX) for ln in done.splitlines()
    )
    said = capsys.readouterr().err
    if accepts:  # v2: what is asked for crosses the wire, and nothing else
        assert few < 8000 < 300 * 60 < many - few and "protocol v0" not in said  # few: ssh's own handshake
    else:  # v0: every ref each time, said once
        assert few > 300 * 60 and said.count("does not accept GIT_PROTOCOL") == 1
    # kakeya's own commands work over ssh either way
    assert main(["status", served.id, "--remote", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "succeeded"


def test_an_ssh_url_kakeya_cannot_use_or_reach_says_why(world: Env, monkeypatch):
    with pytest.raises(G.BusError, match="is not an ssh URL"):
        T.for_url("ssh://host/it's").ls_refs(world.project, [CLAIM_PREFIX], 10)
    planted = world.project / "pwned"  # a host that is an ssh option would run this command (in the store)
    for url in ["ssh://-oProxyCommand=touch pwned/bus.git", "-oProxyCommand=touch pwned:bus.git"]:
        with pytest.raises(G.BusError, match="starts with '-'"):
            T.for_url(url).ls_refs(world.project, [CLAIM_PREFIX], 10)
    assert not planted.exists()
    monkeypatch.setenv("GIT_SSH_COMMAND", "ssh -o BatchMode=yes -o StrictHostKeyChecking=no")
    closed = f"ssh://root@127.0.0.1:{free_port()}/bus.git"
    with pytest.raises(G.BusError, match="refused|closed|Connection"):
        T.for_url(closed).ls_refs(world.project, [CLAIM_PREFIX], 10)
    monkeypatch.delenv("GIT_SSH_COMMAND")
    git(world.project, "config", "core.sshCommand", "/nonexistent-ssh")
    with pytest.raises(G.BusError, match="cannot run ssh"):
        T.for_url("git@127.0.0.1:bus.git").ls_refs(world.project, [CLAIM_PREFIX], 10)
