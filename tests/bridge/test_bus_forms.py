"""Every form of bus that git reads, Kakeya reads: a bare repository, one named without its `.git`, a working
clone, its `.git` directory, file://, a relative path, git:// and http(s). Each is listed by `Bus.list` and must
agree with `git ls-remote` on the same URL; and `kakeya status` works in a clone whose origin is a working
checkout (the README's own fresh clone)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bridge.bus.bus import Bus
from bridge.wire import git as G
from tests.bridge.bus_support import Daemon, HttpGit, git

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
    for form, url in forms.items():
        want = _ls_remote(url, tmp_path)
        assert want.count("\n") == 3, (form, want)
        assert Bus(url, store).list(PREFIXES) == want, form


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
        for url in urls:
            want = _ls_remote(url, tmp_path)
            assert want.count("\n") == 3, (url, want)
            assert Bus(url, store).list(PREFIXES) == want, url
    finally:
        daemon.stop()
        http.stop()


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
