"""The subject's code is untrusted (issue 26): real runners on a `git daemon` bus, under every isolation this
host offers, started as root and as an unprivileged user the test creates, serve hostile requests:

    plant   hooks (and a hooksPath in the config) in every git directory the program can find: its checkout,
            the runner's mirror at the path it guesses from the default layout, every repository above it
    steal   the signing key, /proc/*/environ of every process it sees (the runner's: OPENAI_API_KEY), a hard
            link to the key in its run directory; all of it into stdout, stderr, a file and the report
    kill    a setsid'd daemon, then SIGKILL to its launcher
    hang    a setsid'd daemon, SIGTERM ignored, never exits (the preset's 3 s time limit)

then an honest request. Each ends in one done commit; the runner serves the next. What holds depends on the
isolation (HELD below, the table in the module's last test); under `none` the attacks are expected to work,
and the tests say so by asserting that they do."""

from __future__ import annotations

import base64
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from bridge.bus.bus import Bus
from bridge.bus.records import done_ref, results_path
from bridge.client.client import Client
from bridge.config import Config, load_config
from bridge.core.errors import KakeyaError
from bridge.presets.registry import load_registry
from bridge.run.isolation import bwrap_available, choose, key_problem, readable_by, userns_available
from bridge.wire import git as G
from bridge.wire import transport as T
from tests.bridge.bus_support import (
    DETACH_PY,
    WRITE_REPORT_PY,
    Daemon,
    Env,
    git,
    processes_with,
    stop,
    wait_for,
)

LINUX = sys.platform.startswith("linux")
ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
RUN_UID = 64123  # a root runner's run user: a bare uid with no passwd entry
TEST_USER = "kakeya-sbx"  # the unprivileged runner's user, created here
TOKEN = "sk-runnerSecretOpenAI0426"

HOOKS = (
    "reference-transaction",
    "post-checkout",
    "pre-push",
    "post-commit",
    "pre-commit",
    "post-index-change",
    "pre-auto-gc",
    "post-rewrite",
    "push-to-checkout",
)


# --- the runner's own git -----------------------------------------------------------------------------


def plant_hooks(gitdir: Path, log: Path) -> None:
    (gitdir / "hooks").mkdir(exist_ok=True)
    for name in HOOKS:
        hook = gitdir / "hooks" / name
        hook.write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\ncat > /dev/null\n')
        hook.chmod(0o755)


def test_the_runners_git_runs_no_hook_a_run_planted(tmp_path: Path):
    log = tmp_path / "hooks.log"
    repo = tmp_path / "mirror.git"
    G.init_bare(repo)
    plant_hooks(repo, log)
    with (repo / "config").open("a") as fh:  # and a config that points hooks elsewhere
        fh.write(f"[core]\n\thooksPath = {repo / 'hooks'}\n")
    # the control: git itself runs them
    tree = G.tree_with(repo, None, {"a.txt": b"a"})
    sha = G.commit(repo, tree, [], "m", "T <t@example.com>")
    subprocess.run(["git", "update-ref", "refs/control", sha], cwd=repo, check=True)
    assert "reference-transaction" in log.read_text()  # planted hooks do run for plain git
    log.unlink()
    # every git call of the bridge: objects, refs, a checkout-index export, a fetch and a push
    child = G.child_commit(repo, sha, {"b.txt": b"b"}, "child", "T <t@example.com>")
    G.update_ref(repo, "refs/kakeya/x", child)
    G.update_ref(repo, "refs/kakeya/x", None)
    G.export(repo, child, tmp_path / "export")
    other = G.init_bare(tmp_path / "other.git")
    plant_hooks(other, log)
    assert (
        T.for_url(str(other)).push(repo, [("refs/heads/x", child, None)], atomic=True, timeout=30)[1] is None
    )
    assert T.for_url(str(other)).fetch(repo, ["+refs/heads/x:refs/y"], timeout=30) is None
    G.gc_auto(repo)
    assert not log.exists(), log.read_text()
    # the export is the subject's files alone: nothing points back into the repository
    assert sorted(p.name for p in (tmp_path / "export").iterdir()) == ["a.txt", "b.txt"]


# --- which sandbox, and the key -----------------------------------------------------------------------


@pytest.mark.skipif(not LINUX, reason="bubblewrap and namespaces are Linux-only")
def test_auto_is_the_strongest_the_host_offers(monkeypatch: pytest.MonkeyPatch):
    assert Config().isolation == "auto"
    iso = choose("auto", str(RUN_UID))
    if bwrap_available():
        assert iso.kind == "bwrap" and iso.describe == (f"bwrap (uid {RUN_UID})" if ROOT else "bwrap")
    monkeypatch.setattr("bridge.run.isolation.bwrap_available", lambda: False)
    fallback = choose("auto", str(RUN_UID)).kind
    assert fallback == ("user" if ROOT else "userns" if userns_available() else "none")
    with pytest.raises(KakeyaError, match="bubblewrap is not installed"):
        choose("bwrap", str(RUN_UID))
    monkeypatch.undo()
    if ROOT and bwrap_available():  # no run user: nobody, and it says so
        assert (
            choose("bwrap", "no-such-user-here").describe
            == "bwrap (uid 65534, nobody: no user 'no-such-user-here')"
        )


def test_a_signing_key_within_a_runs_reach_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    key = tmp_path / "keys" / "k"
    key.parent.mkdir()
    key.write_text("key")
    key.chmod(0o600)
    environ = {"HOME": str(tmp_path), "KAKEYA_MODELS": str(tmp_path / "models")}
    for kind in ("none", "userns"):
        iso = choose(kind, "x") if kind == "none" or userns_available() else None
        if iso is not None:
            assert f"under isolation {kind} a run" in (key_problem(str(key), iso, environ) or "")
    assert key_problem(None, choose("none", "x"), environ) is None
    if LINUX and bwrap_available():
        iso = choose("bwrap", str(RUN_UID))
        assert key_problem(str(key), iso, environ) is None
        models = tmp_path / "models"
        models.mkdir()
        inside = models / "k"
        shutil.copy(key, inside)
        assert "which the sandbox shows to every run" in (key_problem(str(inside), iso, environ) or "")
    if ROOT:
        iso = choose("user", str(RUN_UID))
        open_key = Path(tempfile.mkdtemp(prefix="kakeya-test-key-")) / "k"
        open_key.parent.chmod(0o755)
        open_key.write_text("key")
        open_key.chmod(0o644)
        try:
            assert readable_by(open_key, RUN_UID, RUN_UID) and not readable_by(key, RUN_UID, RUN_UID)
            assert "readable by the run user" in (key_problem(str(open_key), iso, environ) or "")
            open_key.chmod(0o600)
            assert key_problem(str(open_key), iso, environ) is None
        finally:
            shutil.rmtree(open_key.parent)


# --- hostile requests against real runners -------------------------------------------------------------

ATTACK_PY = (
    WRITE_REPORT_PY
    + DETACH_PY
    + textwrap.dedent(r'''
    import base64, signal, sys, time
    from pathlib import Path

    mode = sys.argv[1]
    out = os.environ["KAKEYA_RUN_DIR"]

    def daemon(token, ignore_term=False):
        """A process in a session of its own whose parent exits: no longer below the program."""
        if detach():
            code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
            os.execv(sys.executable, [sys.executable, "-c", code, token])

    def gitdirs():
        """Every git directory within reach: the checkout's, the mirror where the default layout puts it,
        any repository in a directory above the checkout or the run directory."""
        found, guesses = [], [os.environ["MIRROR_GUESS"]]
        for start in (os.getcwd(), out):
            p = Path(start)
            for d in [p, *p.parents]:
                guesses += [d / ".git", d / "mirror.git"]
        for g in map(Path, guesses):
            try:
                if g.is_file() and g.read_text().startswith("gitdir:"):
                    g = Path(g.read_text().split(":", 1)[1].strip())
                if (g / "HEAD").is_file() and g not in found:
                    found.append(g)
            except OSError as exc:
                print("refused", g, type(exc).__name__)
        return found

    if mode == "plant":
        for g in gitdirs():
            try:
                (g / "hooks").mkdir(exist_ok=True)
                for name in os.environ["HOOK_NAMES"].split():
                    hook = g / "hooks" / name
                    hook.write_text("#!/bin/sh\necho " + name + " >> " + os.environ["HOOK_LOG"] + "\n")
                    hook.chmod(0o755)
                with open(g / "config", "a") as fh:
                    fh.write("[core]\n\thooksPath = " + str(g / "hooks") + "\n")
                print("planted", g)
            except OSError as exc:
                print("refused", g, type(exc).__name__)
        write_report()
        print("plant done")
    elif mode == "steal":
        loot = []
        for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
            try:
                loot.append(Path(f"/proc/{pid}/environ").read_bytes())
            except OSError as exc:
                print("environ", pid, type(exc).__name__)
        key = os.environ["PROBE_FILE"]
        try:
            loot.append(Path(key).read_bytes())
            print("key read")
        except OSError as exc:
            print("key", type(exc).__name__)
        try:
            os.link(key, os.path.join(out, "key.link"))
            print("key linked")
        except OSError as exc:
            print("link", type(exc).__name__)
        raw = b"\n".join(loot)
        blob = raw + b"\n" + base64.b64encode(raw) + b"\n" + raw[::-1]
        sys.stdout.buffer.write(blob)
        sys.stderr.buffer.write(blob)
        Path(out, "loot.bin").write_bytes(blob)
        write_report()
        report = json.loads(Path(os.environ["KAKEYA_REPORT"]).read_text())
        report["loot"] = blob.decode(errors="replace")
        Path(os.environ["KAKEYA_REPORT"]).write_text(json.dumps(report))
        print("steal done")
    elif mode == "kill":
        write_report()
        daemon(os.environ["TOKEN"])
        print("killing the launcher", flush=True)  # before: the sandbox may end this process at once after
        try:
            os.kill(os.getppid(), signal.SIGKILL)  # the launcher
            print("launcher killed")
        except OSError as exc:
            print("kill", type(exc).__name__)
        time.sleep(1)
    elif mode == "hang":
        write_report()
        daemon(os.environ["TOKEN"])
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(1)
''')
)

HONEST_PY = WRITE_REPORT_PY + "\nwrite_report()\nprint('honest', os.environ['KAKEYA_SUBJECT'])\n"


@dataclass
class Side:
    """One runner of the matrix: who starts it, under which isolation, and its files."""

    isolation: str  # the config value (auto: the default)
    user: str | None  # None: root
    home: Path  # the runner's directory (cwd, workdir, presets, key)
    marks: Path  # where a planted hook would write (anyone may)
    token: str  # in the cmdline of the program's daemons

    @property
    def uid(self) -> int:
        return pwd.getpwnam(self.user).pw_uid if self.user else 0


# What each isolation holds, per attack (False: the attack is expected to work).
HELD = {
    # kind: (hooks planted in the mirror, ancestors' environ, key, launcher killed -> daemon gone)
    "bwrap": dict(plant=True, environ=True, key=True, daemon=True),
    "user": dict(plant=True, environ=True, key=True, daemon=True),
    "userns": dict(plant=False, environ=True, key=False, daemon=True),
    "none": dict(plant=False, environ=False, key=False, daemon=False),
}


def ensure_user(name: str) -> str:
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True
        )
    return name


def searchable_by_others(path: Path) -> bool:
    return all(os.stat(p).st_mode & 0o001 for p in reversed(Path(os.path.realpath(path)).parents))


def as_user(user: str, argv: list[str]) -> list[str]:
    """`argv` run as `user`, where it may start the interpreter (`showing_python`)."""
    ids = pwd.getpwnam(user)
    return showing_python(
        ["setpriv", f"--reuid={ids.pw_uid}", f"--regid={ids.pw_gid}", "--init-groups", "--", *argv]
    )


def showing_python(argv: list[str]) -> list[str]:
    """`argv` (as root) in a mount namespace where the interpreter's directory, if it lies under one closed to
    other users (root's pyenv), is shown, and only it: a host whose Python the run user may start (the
    runner's start-up trial refuses any other, issue 41)."""
    base = Path(os.path.realpath(sys.base_prefix))
    if searchable_by_others(base / "bin"):
        return argv
    hidden = next(p for p in reversed(base.parents) if not os.stat(p).st_mode & 0o001)
    script = (
        'set -e; d=$(mktemp -d); mount --bind "$1" "$d"; mount -t tmpfs -o mode=755 tmpfs "$2"; '
        'mkdir -p "$1"; mount --move "$d" "$1"; shift 2; exec "$@"'
    )
    return [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        "sh",
        str(base),
        str(hidden),
        *argv,
    ]


def make_side(world: Env, isolation: str, user: str | None) -> Side:
    home = Path(tempfile.mkdtemp(prefix="kakeya-sbx-"))
    marks = home / "marks"
    marks.mkdir()
    marks.chmod(0o777)
    if user:
        home.chmod(0o755)
        for p in [home, *home.rglob("*")]:
            os.chown(p, pwd.getpwnam(user).pw_uid, pwd.getpwnam(user).pw_gid)
    return Side(isolation, user, home, marks, f"kakeya-sbx-daemon-{uuid.uuid4().hex[:12]}")


def write_presets(side: Side, python: str) -> Path:
    presets = side.home / "presets"
    presets.mkdir()
    common = {"runners": ["cpu"], "report": {"kind": "probe", "schema_version": 1}, "description": "t"}
    common["network"] = (
        "host"  # as before `none` became the default: this matrix is the isolations' (test_limits)
    )
    attack_env = {
        "MIRROR_GUESS": str(side.home / "runner" / "mirror.git"),
        "HOOK_LOG": str(side.marks / "hooks.log"),
        "HOOK_NAMES": " ".join(HOOKS),
        "PROBE_FILE": str(side.home / "keys" / "runner"),
        "TOKEN": side.token,
    }
    specs = {
        "attack": {
            **common,
            "timeout_s": 3,
            "argv": [python, "attack.py", "{mode}"],
            "params": {
                "mode": {"type": "enum", "choices": ["plant", "steal", "kill", "hang"], "default": "plant"}
            },
            "env": attack_env,
        },
        "honest": {
            **common,
            "timeout_s": 30,
            "argv": [python, "honest.py"],
            "gate": [{"check": "min", "path": "/probe/cpu_count", "value": 1}],
        },
    }
    for name, spec in specs.items():
        (presets / f"{name}.yaml").write_text(yaml.safe_dump({"name": name, **spec}))
    return presets


def committed(store: Path, url: str, rid: str) -> tuple[dict, dict[str, bytes], str]:
    bus = Bus(url, store)
    bus.fetch([done_ref(rid)])
    done = bus.ls_remote(done_ref(rid)).refs[done_ref(rid)]
    files = G.read_dir(store, done, results_path(rid))
    return json.loads(files["result.json"]), files, done


CHOSEN_PY = (
    "import sys; from bridge.run.isolation import choose; print(choose(sys.argv[1], sys.argv[2]).kind)"
)
# user None: the test's own user (root in CI); TEST_USER: an unprivileged user made here (needs root)
CONFIGS = [
    pytest.param("auto", None, id="auto"),
    pytest.param("auto", TEST_USER, id="auto-as-user"),
    pytest.param("user", None, id="user"),
    pytest.param("userns", None, id="userns"),
    pytest.param("userns", TEST_USER, id="userns-as-user"),
    pytest.param("none", None, id="none"),
    pytest.param("none", TEST_USER, id="none-as-user"),
]


@pytest.mark.skipif(not LINUX, reason="the isolations under test are Linux's")
@pytest.mark.parametrize(("isolation", "user"), CONFIGS)
def test_hostile_requests_against_a_real_runner(world: Env, daemon: Daemon, isolation: str, user: str | None):
    if (user or isolation == "user") and not ROOT:
        pytest.skip("a runner as another user, or isolation user, needs root (CI runs as root)")
    if isolation == "userns" and not userns_available():  # (as root; another user: the same kernel rule)
        pytest.skip("unshare --user --pid is not permitted here")
    base = Path(os.path.realpath(sys.base_prefix)) / "bin"
    if user and not searchable_by_others(base):
        trick = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True)
        if trick.returncode:
            pytest.skip(f"{base} is closed to other users and no mount namespace may show it here")
    side = make_side(world, isolation, ensure_user(user) if user else None)
    try:
        run_matrix(world, daemon, side)
    finally:
        for pid in processes_with(side.token):
            os.kill(pid, 9)
        shutil.rmtree(side.home, ignore_errors=True)


def run_matrix(world: Env, daemon: Daemon, side: Side) -> None:
    url = daemon.repo()
    python = "{python}"
    if side.isolation == "user":  # the run user cannot enter root's pyenv: an interpreter it may run
        python = next(
            p
            for p in ("/usr/bin/python3", shutil.which("python3"))
            if p
            and subprocess.run([p, "-c", ""], user=RUN_UID, group=RUN_UID, extra_groups=[]).returncode == 0
        )
    presets = write_presets(side, python)
    for name, body in (("attack.py", ATTACK_PY), ("honest.py", HONEST_PY)):
        (world.project / name).write_text(body)
    git(world.project, "add", "-A")
    git(world.project, "commit", "-qm", "attack")
    subject = git(world.project, "rev-parse", "HEAD")
    keys = side.home / "keys"
    keys.mkdir()
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "runner", "-f", str(keys / "runner")],
        check=True,
    )
    key_body = (keys / "runner").read_text().splitlines()[1].encode()  # a line of the private key
    if side.user:
        for p in [keys, *keys.iterdir(), presets, *presets.iterdir()]:
            os.chown(p, side.uid, pwd.getpwnam(side.user).pw_gid)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAKEYA_")} | {
        "KAKEYA_PRESETS": str(presets),
        "KAKEYA_RUN_USER": str(RUN_UID),
        "KAKEYA_LEASE": "10",
        "OPENAI_API_KEY": TOKEN,
        "HOME": str(side.home),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    if side.isolation != "auto":
        env["KAKEYA_ISOLATION"] = side.isolation
    argv = [sys.executable, "-m", "bridge.cli", "runner"]
    flags = ["--labels", "cpu", "--name", "sbx", "--remote", url, "--workdir", str(side.home / "runner")]
    wrap = (lambda a: as_user(side.user, a)) if side.user else showing_python
    chosen = subprocess.run(  # what the runner's own user gets here
        wrap([sys.executable, "-c", CHOSEN_PY, side.isolation, str(RUN_UID)]),
        env=env,
        cwd=side.home,
        capture_output=True,
        text=True,
        check=True,
    )
    kind = chosen.stdout.strip()
    if not side.user and ROOT and kind in ("none", "userns"):  # its runs would be root, or hold root's files
        refused = subprocess.run(
            wrap([*argv, "once", *flags]), env=env, cwd=side.home, capture_output=True, text=True
        )
        assert refused.returncode != 0, refused.stderr
        assert (
            f"refusing to serve: as root, isolation {kind} runs each program with root's own files"
            in refused.stderr
        )
        assert refused.stderr.strip().splitlines()[-1].startswith("kakeya: error: refusing"), refused.stderr
        return
    held, signing = HELD[kind], kind in ("bwrap", "user")
    refused = subprocess.run(
        wrap([*argv, "once", *flags]),
        env=env | {"KAKEYA_SIGNING_KEY": str(keys / "runner")},
        cwd=side.home,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if signing:
        assert refused.returncode == 0, refused.stderr
        env["KAKEYA_SIGNING_KEY"] = str(keys / "runner")
    else:  # a run could read the key: the runner will not sign
        assert refused.returncode != 0 and "refusing to start: signing key" in refused.stderr, refused.stderr
    log = (side.home / "runner.log").open("ab")
    runner = subprocess.Popen(
        wrap([*argv, "watch", "--poll", "0.2", *flags]),
        env=env,
        cwd=side.home,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    client = Client(load_config(), remote=url)
    registry = load_registry(presets)
    bus = Bus(url, world.project)

    def serve(preset: str, params: dict) -> tuple[dict, dict[str, bytes], str]:
        rid = client.request(preset, params, "cpu", registry=registry).id
        wait_for(lambda: bus.ls_remote().entries[rid].done, 60, f"{preset} {params} done", step=0.1)
        return committed(world.project, url, rid)

    try:
        # (a) hooks everywhere it can reach; then an honest request
        result, files, _ = serve("attack", {"mode": "plant"})
        stdout = files["logs/stdout.log"].decode()
        assert result["status"] == "succeeded" and "plant done" in stdout, (
            result,
            stdout,
            files["logs/stderr.log"],
        )
        assert (f"planted {side.home / 'runner' / 'mirror.git'}" in stdout) != held["plant"], stdout
        assert "/work/" not in stdout.replace(str(world.project), "")  # never the runner's checkout of kakeya
        result, files, done = serve("honest", {})
        assert result["status"] == "succeeded" and result["verdict"] == "pass", result
        assert files["logs/stdout.log"].decode() == f"honest {subject}\n"
        assert json.loads(files["report.json"])["subject"] == subject
        assert not (side.marks / "hooks.log").exists(), (side.marks / "hooks.log").read_text()
        if signing:
            assert "gpgsig" in G.out(world.project, "cat-file", "commit", done)
            assert result["isolation"].startswith(kind)
        # (b) the key, the runner's environment
        result, files, done = serve("attack", {"mode": "steal"})
        stdout = files["logs/stdout.log"].decode(errors="replace")
        assert result["status"] == "succeeded" and "steal done" in stdout, (result, stdout[-2000:])
        blobs = b"\n".join(files.values()) + G.out(world.project, "log", "--format=%B", done).encode()
        for secret, holds in ((TOKEN.encode(), held["environ"]), (key_body, held["key"])):
            leaked = any(form in blobs for form in (secret, base64.b64encode(secret)[:40], secret[::-1]))
            assert leaked != holds, (secret, holds, stdout[:3000])
        assert "key.link" not in files  # a hard link to it is never committed (caps drop hard links)
        if not held["key"]:  # where the run could reach the key, it did link it: dropped, and listed
            assert "key linked" in stdout and any("key.link" in d for d in result["dropped"]), result[
                "dropped"
            ]
        # (c) the launcher killed, a setsid'd daemon left behind
        result, files, _ = serve("attack", {"mode": "kill"})
        stdout = files["logs/stdout.log"].decode()
        assert "killing the launcher" in stdout, (result, stdout)  # it tried (and, killed, may say no more)
        assert result["status"] != "succeeded" or "kill PermissionError" in stdout, (result, stdout)
        alive = processes_with(side.token)
        assert bool(alive) != held["daemon"], (alive, stdout, result)
        for pid in alive:
            os.kill(pid, 9)
        # (d) never exits, ignores SIGTERM: ended at the 3 s limit, with its daemon
        started = time.monotonic()
        result, files, _ = serve("attack", {"mode": "hang"})
        took = time.monotonic() - started
        assert result["status"] == "timed-out" and took < 3 + 2 + 10, (result, took)
        assert processes_with(side.token) == []
        # the runner is still serving, and every request has one done commit
        result, _, _ = serve("honest", {})
        assert result["status"] == "succeeded" and result["verdict"] == "pass"
        entries = bus.ls_remote().entries.values()
        assert len(entries) == 6 and all(e.done for e in entries)
        assert runner.poll() is None
        print(
            f"\nFIGURE {side.isolation} as {side.user or 'root'}: {result['isolation']}; held {held}; hang ended after {took:.1f} s"
        )
    finally:
        code = stop(runner)
        print((side.home / "runner.log").read_text()[-3000:])
    assert code == 0


def test_doctor_says_which_sandbox_and_fails_a_key_in_reach(
    world: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
):
    from bridge.cli.main import main

    key = tmp_path / "k"
    key.write_text("key")
    key.chmod(0o600)
    monkeypatch.setenv("KAKEYA_SIGNING_KEY", str(key))
    main(["doctor"])
    out = capsys.readouterr().out
    assert "FAIL  isolation a runner would refuse to start: signing key" in out  # world: isolation none
    assert "under isolation none a run runs as the runner's user" in out
    if LINUX and bwrap_available():
        monkeypatch.delenv("KAKEYA_ISOLATION")
        monkeypatch.setenv("KAKEYA_RUN_USER", str(RUN_UID))
        main(["doctor"])
        want = f"bwrap (uid {RUN_UID})" if ROOT else "bwrap"
        assert f"ok    isolation {want} (config isolation = auto)\n" in capsys.readouterr().out


def test_kakeya_run_of_ones_own_request_runs_unsigned_where_the_key_is_in_reach(
    world: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
):
    from bridge.cli.main import main

    key = tmp_path / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    monkeypatch.setenv("KAKEYA_SIGNING_KEY", str(key))  # signs this user's requests; world: isolation none
    assert main(["run", "work", "-p", "tag=mine"]) == 0
    err = capsys.readouterr().err
    assert "kakeya: the result is not signed: signing key" in err and "under isolation none" in err
    assert world.count() == ["mine"]
    done = next(
        e.done
        for e in Bus(str(world.project / ".kakeya" / "bus.git"), world.project).ls_remote().entries.values()
    )
    assert done and "gpgsig" not in G.out(world.project / ".kakeya" / "bus.git", "cat-file", "commit", done)


@pytest.mark.skipif(not (LINUX and bwrap_available()), reason="bubblewrap is not usable here")
def test_a_network_none_preset_in_the_sandbox_reaches_nothing(tmp_path: Path, daemon: Daemon):
    from bridge.presets.preset import Preset
    from bridge.run.execute import execute

    (tmp_path / "subject").mkdir()
    (tmp_path / "subject" / "net.py").write_text(
        "import json, os, socket, sys\n"
        "try:\n    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=2); seen = 'connected'\n"
        "except OSError as exc:\n    seen = f'no network: {exc}'\n"
        "json.dump({'kind': 'probe', 'seen': seen}, open(os.environ['KAKEYA_REPORT'], 'w'))\n"
    )
    results = {}
    for network in ("host", "none"):
        p = Preset.model_validate(
            {
                "name": "net",
                "description": "t",
                "runners": ["cpu"],
                "timeout_s": 20,
                "argv": ["{python}", "net.py", str(daemon.port)],
                "report": {"kind": "probe", "schema_version": 1},
                "network": network,
            }
        )
        out = tmp_path / network
        result = execute(
            p, {}, tmp_path / "subject", out, config=Config(isolation="bwrap", run_user=str(RUN_UID))
        )
        assert result.isolation and result.isolation.startswith("bwrap") and result.network == network
        results[network] = json.loads((out / "report.json").read_text())["seen"]
    assert results["host"] == "connected" and results["none"].startswith("no network: ")
