"""Every form of bus that git reads, Kakeya reads: a bare repository, one named without its `.git`, a working
clone, its `.git` directory, file://, a relative path, ssh (ssh://, git+ssh://, scp-like host:path, through a
real sshd on 127.0.0.1), git:// and http(s). Each is listed by `Bus.list` and must agree with `git ls-remote` on
the same URL, through the transport git itself would use; `kakeya status` works in a clone whose origin is a
working checkout (the README's own fresh clone); and a form that cannot be a bus is refused saying what to do."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from bridge.bus.bus import Bus
from bridge.bus.records import Update
from bridge.core.errors import BusError
from bridge.wire import git as G
from bridge.wire import transport as T
from tests.bridge.bus_support import Daemon, HttpGit, git
from tests.bridge.test_bus_ssh import SSHD, Sshd

PREFIXES = ("refs/heads/kakeya/", "refs/kakeya/")
IDENT = {
    "GIT_AUTHOR_NAME": "T",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "T",
    "GIT_COMMITTER_EMAIL": "t@t",
}


def _populate(repo: Path, bus_refs: bool = True) -> None:
    """A working repository with a main branch and (`bus_refs`) refs under the bus's prefixes."""
    git(repo, "init", "-q", "-b", "main")
    (repo / "a.txt").write_text("a\n")
    git(repo, "add", "a.txt")
    subprocess.run(["git", "commit", "-qm", "a"], cwd=repo, check=True, env={**os.environ, **IDENT})
    head = git(repo, "rev-parse", "HEAD")
    for ref in (
        ()
        if not bus_refs
        else (
            "refs/heads/kakeya/req/cpu/20261128T000000.000Z-probe-abcdef",
            "refs/kakeya/claim/20261128T000000.000Z-probe-abcdef",
            "refs/kakeya/runners/r1",
        )
    ):
        git(repo, "update-ref", ref, head)


def _ls_remote(url: str, cwd: Path) -> str:
    out = subprocess.run(
        ["git", "ls-remote", url], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout
    return "".join(ln + "\n" for ln in out.splitlines() if ln.split("\t")[1].startswith(PREFIXES))


@pytest.fixture(name="forms")
def forms_fixture(tmp_path: Path) -> dict[str, str]:
    work = tmp_path / "work"
    work.mkdir()
    _populate(work)
    git(tmp_path, "clone", "-q", "--mirror", str(work), str(tmp_path / "bare.git"))
    return {
        "bare": str(tmp_path / "bare.git"),
        "bare, named without .git": str(tmp_path / "bare"),
        "working clone": str(work),
        "working clone's .git": str(work / ".git"),
        "file:// bare": f"file://{tmp_path / 'bare.git'}",
        "file:// working clone": f"file://{work}",
        "working clone, trailing slash": str(work) + "/",
    }


def test_every_local_form_lists_as_git_ls_remote_does(forms: dict[str, str], tmp_path: Path):
    store = G.init_bare(tmp_path / "store.git")
    forms["file:// working clone's .git"] = f"file://{tmp_path / 'work' / '.git'}"
    for form, url in forms.items():
        want = _ls_remote(url, tmp_path)
        assert want.count("\n") == 3, (form, want)
        bus = Bus(url, store)
        assert isinstance(bus.transport, T.Local), form  # chosen once, when the bus is opened
        assert bus.list(PREFIXES) == want, form


def test_a_relative_path_is_read_from_where_the_user_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The store is elsewhere (git runs there): a relative bus path still means the user's directory."""
    work = tmp_path / "work"
    work.mkdir()
    _populate(work)
    store = G.init_bare(tmp_path / "deep" / "store.git")
    monkeypatch.chdir(tmp_path)
    assert Bus("work", store).list(PREFIXES) == _ls_remote("work", tmp_path)
    assert Bus("./work/.git", store).list(PREFIXES) == _ls_remote("./work/.git", tmp_path)


def test_git_daemon_and_http_forms_list_as_git_ls_remote_does(tmp_path: Path):
    work = tmp_path / "work"
    work.mkdir()
    _populate(work)
    store = G.init_bare(tmp_path / "store.git")
    daemon = Daemon(tmp_path / "served").start()
    http = HttpGit(tmp_path / "http")
    try:
        urls = [daemon.repo(), http.repo()]
        for base in (daemon.base, http.base):
            git(
                work,
                "push",
                "-q",
                str(base / "bus.git"),
                "refs/heads/*:refs/heads/*",
                "refs/kakeya/*:refs/kakeya/*",
            )
        for url, kind in zip(urls, (T.Daemon, T.Http), strict=True):
            want = _ls_remote(url, tmp_path)
            assert want.count("\n") == 3, (url, want)
            bus = Bus(url, store)
            assert isinstance(bus.transport, kind), url
            assert bus.list(PREFIXES) == want, url
    finally:
        daemon.stop()
        http.stop()


@pytest.mark.skipif(not Path(SSHD).is_file() or os.geteuid() != 0, reason="needs OpenSSH's sshd and root")
@pytest.mark.parametrize("accept_env", [True, False], ids=["accept-env", "stock"])
def test_ssh_forms_list_as_git_ls_remote_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, accept_env: bool
):
    """ssh://, git+ssh:// and scp-like user@host:path, to a bare repository and to a working clone, through an
    sshd that accepts GIT_PROTOCOL (protocol v2) and one that does not (v0, filtered here)."""
    work = tmp_path / "work"
    work.mkdir()
    _populate(work)
    git(tmp_path, "clone", "-q", "--mirror", str(work), str(tmp_path / "bare.git"))
    store = G.init_bare(tmp_path / "store.git")
    sshd = Sshd(tmp_path / "sshd", accept_env)
    # the port in the ssh command, so that scp-like host:path (which has no port) reaches this sshd too
    monkeypatch.setenv("GIT_SSH_COMMAND", f"{sshd.command} -p {sshd.port}")
    user = os.environ.get("USER", "root")
    try:
        for repo in (tmp_path / "bare.git", work, work / ".git"):
            for url in (
                f"ssh://{user}@127.0.0.1{repo}",
                f"git+ssh://{user}@127.0.0.1{repo}",
                f"{user}@127.0.0.1:{repo}",
            ):
                want = _ls_remote(url, tmp_path)
                assert want.count("\n") == 3, (url, want)
                bus = Bus(url, store)
                assert isinstance(bus.transport, T.Ssh), url
                assert bus.list(PREFIXES) == want, url
    finally:
        sshd.stop()


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("ext::sh -c true", "remote helper 'ext' is not one kakeya speaks; name it by a path"),
        ("ftp://example.com/bus.git", "does not speak ftp:// to a bus; name it by a path"),
        ("ssh://host/it's", "is not an ssh URL"),
        ("ssh://-oProxyCommand=true/bus.git", "starts with '-'"),
    ],
)
def test_a_url_that_cannot_be_a_bus_is_refused_when_the_bus_is_opened(tmp_path: Path, url: str, said: str):
    with pytest.raises(BusError, match=re.escape(said)):
        Bus(url, tmp_path)


def test_a_bundle_is_refused_as_a_bus_saying_what_to_name(tmp_path: Path):
    """git reads a bundle file as a remote, but nothing can be pushed to one."""
    work = tmp_path / "work"
    work.mkdir()
    _populate(work)
    git(work, "bundle", "create", str(tmp_path / "bus.bundle"), "--all")
    assert _ls_remote(str(tmp_path / "bus.bundle"), tmp_path).count("\n") == 3  # git reads it
    with pytest.raises(BusError, match="a git bundle cannot be a bus.*git clone --bare"):
        Bus(str(tmp_path / "bus.bundle"), tmp_path)


@pytest.mark.parametrize("way", ["receive-pack", "git push"])
def test_a_working_clone_with_the_pushed_branch_checked_out_is_refused_saying_what_to_do(
    tmp_path: Path, way: str
):
    """git moves no branch that a work tree has checked out (receive.denyCurrentBranch): a bus that is a working
    clone on a request branch cannot take that branch's updates, and retrying never helps."""
    site = tmp_path / "site"
    site.mkdir()
    _populate(site)
    branch = "refs/heads/kakeya/req/cpu/20261128T000000.000Z-probe-abcdef"
    git(site, "switch", "-q", branch.removeprefix("refs/heads/"))
    head = git(site, "rev-parse", "HEAD")
    store = G.init_bare(tmp_path / "store.git")
    git(store, "fetch", "-q", str(site), "main")
    if way == "git push":
        git(store, "config", "push.gpgSign", "if-asked")  # what only git push does: the bus pushes with it
    bus = Bus(str(site), store)
    assert bus.receive_pack is (way == "receive-pack")
    with pytest.raises(BusError, match=r"working clone with kakeya/req/cpu/.* checked out.*git -C .* switch"):
        bus.swap([Update(branch, None, head)])
    assert git(site, "rev-parse", branch) == head  # nothing moved
    bus.swap([Update("refs/kakeya/claim/20261128T000000.000Z-probe-abcdef", None, head)])  # the rest is a bus


def test_a_missing_bus_says_so_as_git_does(tmp_path: Path):
    store = G.init_bare(tmp_path / "store.git")
    with pytest.raises(Exception, match="cannot reach the bus at .*nowhere"):
        Bus(str(tmp_path / "nowhere"), store).list(PREFIXES)
    (tmp_path / "plain").mkdir()
    with pytest.raises(Exception, match="cannot reach the bus at .*plain.*not .*git repository"):
        Bus(str(tmp_path / "plain"), store).list(PREFIXES)


def test_status_in_a_fresh_clone_whose_origin_is_a_working_checkout(world, tmp_path: Path):
    """The README's fresh clone: `git clone <a checkout>`; origin is a working tree, and `kakeya status` reads it."""
    clone = tmp_path / "fresh"
    git(tmp_path, "clone", "-q", str(world.project), str(clone))
    _populate_bus_ref = "refs/heads/kakeya/req/cpu/20261128T000000.000Z-probe-abcdef"
    git(world.project, "update-ref", _populate_bus_ref, git(world.project, "rev-parse", "HEAD"))
    proc = subprocess.run(
        ["kakeya", "status", "--json"], cwd=clone, capture_output=True, text=True, timeout=120, env=os.environ
    )
    assert proc.returncode == 0, proc.stderr
    assert "20261128T000000.000Z-probe-abcdef" in proc.stdout
    assert str(world.project) in proc.stderr  # the bus it used, named


@pytest.mark.parametrize("suffix", ["", "/.git"])
def test_request_run_and_gate_on_a_bus_that_is_a_working_clone(world, tmp_path: Path, capsys, suffix: str):
    """A working clone as the bus, named by its work tree or its .git: request, serve, wait and gate."""
    from bridge.cli.main import main
    from tests.bridge.bus_support import make_runner

    site = tmp_path / "site"
    site.mkdir()
    _populate(site, bus_refs=False)
    url = str(site) + suffix
    head = git(world.project, "rev-parse", "HEAD")
    assert main(["request", "work", "--runner", "cpu", "--remote", url]) == 0
    rid = capsys.readouterr().out.strip().splitlines()[-1]
    done = make_runner(url, world).once()
    assert done is not None and done.pushed and done.id == rid
    assert git(site, "rev-parse", f"refs/kakeya/done/{rid}") == done.done
    assert main(["wait", rid, "--remote", url]) == 0
    gate = ["gate", "pr", "--subject", head, "--require", "work@cpu", "--remote", url, "--allow-unsigned"]
    assert main(gate) == 0
    assert git(site, "status", "--porcelain") == ""  # the clone's work tree and branch are untouched
