"""What a run may take of its host (issue 40, items 4, 5, 6 and /etc; issue 41, item 3): real runners (`runner
watch`) on a `git daemon` bus under the default configuration (isolation auto), as root and as an unprivileged
user, serve hostile requests:

    tmp      1 GiB written to /tmp (limit 64 MiB per file); /tmp and /dev/shm are the scratch disk's, not a
             tmpfs of the host's memory
    memory   1 GiB allocated (limit 256 MiB)
    fork     a fork bomb (limit 64 processes)
    venv     a .pth written into the runner's venv
    etc      /etc's passwd, hosts, resolv.conf and CA certificates read as the run user
    net      a push to the bus on the host's 127.0.0.1; two concurrent runs reach for each other's abstract
             unix socket and port

Each ends in one done commit saying what happened, and the runner serves the next request. Without bubblewrap
(a PATH without it) a runner refuses to serve until the isolation is named; a run user that cannot start the
runner's Python is refused with the fix, by `runner watch` and by `kakeya doctor`."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import site
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest
import yaml

from bridge.bus.bus import Bus
from bridge.client.client import Client
from bridge.config import load_config
from bridge.presets.registry import load_registry
from bridge.run.isolation import bwrap_available
from tests.bridge.bus_support import WRITE_REPORT_PY, Daemon, Env, git, processes_with, stop, wait_for
from tests.bridge.test_sandbox import (
    RUN_UID,
    TEST_USER,
    as_user,
    committed,
    ensure_user,
    showing_python,
)

LINUX = sys.platform.startswith("linux")
ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
REPO = Path(__file__).resolve().parents[2]
# The run user of these runners: a bare uid no other test runs as. The kernel counts a user's processes
# host-wide, so other tests' runs as the same uid would spend part of a fork bomb's budget where the
# launcher, in the run's PID namespace, cannot count them.
LIMITS_UID = 64124
pytestmark = pytest.mark.skipif(not (LINUX and bwrap_available()), reason="needs Linux and bubblewrap")

HOG_PY = WRITE_REPORT_PY + textwrap.dedent(r"""
    import socket, sys, time
    from pathlib import Path

    mode = sys.argv[1]
    if mode == "tmp":
        sizes = {p: os.statvfs(p).f_blocks * os.statvfs(p).f_frsize for p in ("/tmp", "/dev/shm")}
        print("sizes", json.dumps(sizes), flush=True)
        with open("/tmp/fill", "wb") as fh:
            for _ in range(1024):
                fh.write(b"\0" * (1 << 20))
        print("wrote 1 GiB")
    elif mode == "memory":
        hog = bytearray(1 << 30)
        print("allocated 1 GiB")
    elif mode == "fork":
        n = 0
        while True:
            try:
                pid = os.fork()
            except BlockingIOError:
                print("forks refused after", n, flush=True)
                sys.exit(3)
            if pid == 0:
                time.sleep(30)
                os._exit(0)
            n += 1
    elif mode == "noisy":  # says a word of memory and of files early on, then fails of something else
        print("warning: cudaMalloc: out of memory; MemoryError; File too large [Errno 27]", file=sys.stderr)
        for i in range(10):
            print("step", i, "ok", file=sys.stderr)
        sys.exit(2)
    elif mode == "host":  # the runner's venv, then /etc as the run user
        for d in os.environ["RUNNER_DIRS"].split(":"):
            try:
                Path(d, "kakeya-evil.pth").write_text("# a .pth that ran no code (a test's)\n")
                print("wrote", d)
            except OSError as exc:
                print("refused", d, type(exc).__name__)
        for f in ("/etc/passwd", "/etc/hosts", "/etc/resolv.conf", "/etc/ssl/certs/ca-certificates.crt"):
            try:
                print("read", f, len(Path(f).read_bytes()) > 0)
            except OSError as exc:
                print("unreadable", f, type(exc).__name__)
        write_report()
    elif mode in ("listen", "reach"):
        token, port = os.environ["TOKEN"], int(os.environ["MEET_PORT"])
        if mode == "listen":
            unix = socket.socket(socket.AF_UNIX)
            unix.bind("\0" + token)
            unix.listen()
            tcp = socket.create_server(("127.0.0.1", port))
            for s in (unix, tcp):
                s.settimeout(4)
                try:
                    s.accept()
                    print("reached by the other run")
                except OSError as exc:
                    print("nobody came", type(exc).__name__)
        else:
            import subprocess
            bus = os.environ["BUS_URL"]
            for what in ("daemon", "unix", "tcp"):
                for _ in range(20):
                    try:
                        if what == "unix":
                            socket.socket(socket.AF_UNIX).connect("\0" + token)
                        else:
                            p = int(bus.split(":")[2].split("/")[0]) if what == "daemon" else port
                            socket.create_connection(("127.0.0.1", p), timeout=1)
                        print("connected", what, flush=True)
                        break
                    except OSError:
                        time.sleep(0.2)
                else:
                    print("unreachable", what, flush=True)
            env = dict(os.environ, GIT_AUTHOR_NAME="x", GIT_AUTHOR_EMAIL="x@x", GIT_COMMITTER_NAME="x",
                       GIT_COMMITTER_EMAIL="x@x")
            d = os.path.join(os.environ["TMPDIR"], "evil")
            cmds = [["git", "init", "-q", d], ["git", "-C", d, "commit", "-q", "--allow-empty", "-m", "evil"],
                    ["git", "-C", d, "push", bus, "HEAD:refs/heads/kakeya/evil"]]
            for cmd in cmds:
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            print("push", "ok" if proc.returncode == 0 else "failed: " + proc.stderr.strip()[-200:])
        write_report()
""")


def write_presets(home: Path, python: str, env: dict[str, str]) -> Path:
    presets = home / "presets"
    presets.mkdir()
    common = {"runners": ["cpu"], "report": {"kind": "probe", "schema_version": 1}, "description": "t"}
    modes = ["tmp", "memory", "fork", "host", "listen", "reach", "noisy"]
    specs = {
        "hog": {
            **common,
            "timeout_s": 30,
            "argv": [python, "hog.py", "{mode}"],
            "params": {"mode": {"type": "enum", "choices": modes, "default": "tmp"}},
            "env": env,
            "limits": {"memory_mb": 256, "processes": 64, "file_mb": 64},
        },
    }
    for name, spec in specs.items():
        (presets / f"{name}.yaml").write_text(yaml.safe_dump({"name": name, **spec}))
    return presets


class Runners:
    """`runner watch` processes of one configuration on the bus at `url`."""

    def __init__(self, world: Env, url: str, isolation: str, user: str | None):
        self.world, self.url, self.user = world, url, user
        self.home = Path(tempfile.mkdtemp(prefix="kakeya-lim-"))
        self.token = f"kakeya-lim-{uuid.uuid4().hex[:12]}"
        self.dirs = [p for p in site.getsitepackages() + [sys.prefix] if os.path.isdir(p)]
        self.presets = write_presets(
            self.home,
            "{python}",
            {"RUNNER_DIRS": ":".join(self.dirs), "TOKEN": self.token, "BUS_URL": url, "MEET_PORT": "47631"},
        )
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("KAKEYA_")} | {
            "KAKEYA_PRESETS": str(self.presets),
            "KAKEYA_RUN_USER": str(LIMITS_UID),
            "KAKEYA_LEASE": "10",
            "HOME": str(self.home),
            "PYTHONPATH": str(REPO),
        }
        if isolation != "auto":
            self.env["KAKEYA_ISOLATION"] = isolation
        if user:
            self.home.chmod(0o755)
            ids = pwd.getpwnam(user)
            for p in [self.home, *self.home.rglob("*")]:
                os.chown(p, ids.pw_uid, ids.pw_gid)
        self.wrap = (lambda a: as_user(user, a)) if user else showing_python
        self.procs: list[subprocess.Popen[bytes]] = []

    def argv(self, mode: str, name: str) -> list[str]:
        flags = ["--labels", "cpu", "--name", name, "--remote", self.url, "--workdir", str(self.home / name)]
        return self.wrap([sys.executable, "-m", "bridge.cli", "runner", mode, "--poll", "0.2", *flags])

    def start(self, name: str) -> None:
        log = (self.home / f"{name}.log").open("ab")
        self.procs.append(
            subprocess.Popen(self.argv("watch", name), env=self.env, cwd=self.home, stdout=log, stderr=log)
        )

    def log(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.home.glob("*.log"))

    def close(self) -> None:
        for proc in self.procs:
            stop(proc)
        for pid in processes_with(self.token):
            os.kill(pid, 9)
        shutil.rmtree(self.home, ignore_errors=True)


def setup_world(world: Env, isolation: str, user: str | None, daemon: Daemon) -> Runners:
    if user and not ROOT:
        pytest.skip("a runner as another user needs root (CI runs as root)")
    (world.project / "hog.py").write_text(HOG_PY)
    git(world.project, "add", "-A")
    git(world.project, "commit", "-qm", "hog")
    return Runners(world, daemon.repo(), isolation, ensure_user(user) if user else None)


def request(runners: Runners, preset: str, params: dict, wait: bool = True) -> str:
    client = Client(load_config(), remote=runners.url)
    rid = client.request(preset, params, "cpu", registry=load_registry(runners.presets)).id
    if wait:
        return done(runners, rid)
    return rid


def done(runners: Runners, rid: str) -> str:
    bus = Bus(runners.url, runners.world.project)
    wait_for(lambda: bus.ls_remote().entries[rid].done, 60, f"{rid} done ({runners.log()[-2000:]})", step=0.1)
    return rid


def result_of(runners: Runners, rid: str) -> tuple[dict, str]:
    result, files, _ = committed(runners.world.project, runners.url, rid)
    return result, files.get("logs/stdout.log", b"").decode(errors="replace")


CONFIGS = [pytest.param("auto", None, id="root"), pytest.param("auto", TEST_USER, id="as-user")]


@pytest.mark.parametrize(("isolation", "user"), [*CONFIGS, pytest.param("user", None, id="root-user")])
def test_hostile_workloads_reach_their_limits_and_the_runner_serves_on(
    world: Env, daemon: Daemon, isolation: str, user: str | None
):
    runners = setup_world(world, isolation, user, daemon)
    try:
        runners.start("lim")
        host_shm = os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize
        scratch_disk = os.statvfs(tempfile.gettempdir()).f_blocks * os.statvfs(tempfile.gettempdir()).f_frsize
        limits = {
            "tmp": "its limit of 64 MiB per file, /tmp's too (limits.file_mb)",
            "memory": "its memory limit of 256 MiB per process (limits.memory_mb)",
            "fork": "its limit of 64 processes and threads (limits.processes)",
        }
        for mode, why in limits.items():
            result, stdout = result_of(runners, request(runners, "hog", {"mode": mode}))
            assert result["status"] == "error" and why in result["reason"], (mode, result, stdout)
            if (
                mode == "tmp" and isolation != "user"
            ):  # /tmp and /dev/shm inside are the scratch's disk, not the host's shared memory
                sizes = json.loads(stdout.split("sizes ", 1)[1].splitlines()[0])
                kinds = {"disk": scratch_disk, "host /dev/shm": host_shm}
                if kind_of := [k for k, v in kinds.items() if v == sizes["/tmp"] == sizes["/dev/shm"]]:
                    assert kind_of == ["disk"] or scratch_disk == host_shm, (sizes, kinds)
                else:
                    raise AssertionError((sizes, kinds))
            if mode == "fork":
                assert "forks refused after" in stdout and processes_with(runners.token) == []
        # the launcher says what showed the limit; a run that only talks of memory and fails is its own failure
        result, _ = result_of(runners, request(runners, "hog", {"mode": "memory"}))
        assert "after an allocation was refused" in result["reason"], result
        result, _ = result_of(runners, request(runners, "hog", {"mode": "noisy"}))
        assert (result["status"], result["exit_code"]) == ("failed", 2), result
        # served on: the runner's venv stays its own; /etc is readable by the run user
        result, stdout = result_of(runners, request(runners, "hog", {"mode": "host"}))
        assert result["status"] == "succeeded", result
        for d in runners.dirs:
            assert f"refused {d}" in stdout and not Path(d, "kakeya-evil.pth").exists(), stdout
        for f in ("/etc/passwd", "/etc/hosts", "/etc/resolv.conf", "/etc/ssl/certs/ca-certificates.crt"):
            if Path(f).is_file():
                assert f"read {f} True" in stdout, stdout
        assert all(p.poll() is None for p in runners.procs)
        assert "isolation bwrap" in runners.log() or isolation == "user"
        assert "it does not protect" in runners.log()
    finally:
        for d in runners.dirs:
            Path(d, "kakeya-evil.pth").unlink(missing_ok=True)
        if isolation == "user":  # the host's /tmp is the run's under isolation user (docs/runners.md)
            Path("/tmp/fill").unlink(missing_ok=True)
        runners.close()


@pytest.mark.parametrize(("isolation", "user"), CONFIGS)
def test_a_run_reaches_no_network_and_no_other_run(
    world: Env, daemon: Daemon, isolation: str, user: str | None
):
    runners = setup_world(world, isolation, user, daemon)
    try:
        runners.start("one")
        runners.start("two")
        listen = request(runners, "hog", {"mode": "listen"}, wait=False)
        reach = request(runners, "hog", {"mode": "reach"}, wait=False)
        done(runners, listen)
        done(runners, reach)
        (listened, heard), (reached, tried) = result_of(runners, listen), result_of(runners, reach)
        assert heard.count("nobody came") == 2 and "reached" not in heard, heard
        for what in ("daemon", "unix", "tcp"):
            assert f"unreachable {what}" in tried, tried
        assert "push failed" in tried and "kakeya/evil" not in G_refs(runners.url, world.project), tried
        assert listened["network"] == reached["network"] == "none"
        assert reached["started_at"] < listened["ended_at"] and listened["started_at"] < reached["ended_at"]
    finally:
        runners.close()


def G_refs(url: str, store: Path) -> str:
    return subprocess.run(["git", "ls-remote", url], capture_output=True, text=True, cwd=store).stdout


def without_bwrap(tmp: Path) -> str:
    """A PATH with every tool of this host but bubblewrap: a host without it."""
    bindir = tmp / "bin-without-bwrap"
    bindir.mkdir()
    for d in os.environ["PATH"].split(":") + ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]:
        if os.path.isdir(d):
            for tool in os.listdir(d):
                if tool != "bwrap" and not (bindir / tool).exists():
                    (bindir / tool).symlink_to(os.path.join(d, tool))
    return str(bindir)


@pytest.mark.parametrize("user", [pytest.param(None, id="root"), pytest.param(TEST_USER, id="as-user")])
def test_without_bubblewrap_a_runner_refuses_until_the_isolation_is_named(
    world: Env, daemon: Daemon, user: str | None
):
    runners = setup_world(world, "auto", user, daemon)
    try:
        runners.env |= {"PATH": without_bwrap(runners.home), "KAKEYA_RUN_USER": "0"}  # no run user either
        refused = subprocess.run(
            runners.argv("once", "weak"), env=runners.env, cwd=runners.home, capture_output=True, text=True
        )
        assert refused.returncode != 0, refused.stderr
        assert "refusing to serve: isolation auto found no bubblewrap and no run user" in refused.stderr
        assert ('isolation = "userns"' in refused.stderr) != (not user), refused.stderr
        # kakeya run and kakeya exec refuse as the runner does, before any request or run
        project = runners.home / "project"
        shutil.copytree(runners.world.project, project)
        if user:
            ids = pwd.getpwnam(user)
            for path in [project, *project.rglob("*")]:
                os.chown(path, ids.pw_uid, ids.pw_gid, follow_symlinks=False)
        for verb in (
            ["exec", "hog", "-p", "mode=host"],
            ["run", "hog", "-p", "mode=host", "--remote", runners.url],
        ):
            said = subprocess.run(
                runners.wrap([sys.executable, "-m", "bridge.cli", *verb]),
                env=runners.env,
                cwd=project,
                capture_output=True,
                text=True,
            )
            assert said.returncode != 0 and not (project / "out").exists(), (verb, said.stdout, said.stderr)
            assert "refusing to run: isolation auto found no bubblewrap and no run user" in said.stderr, (
                said.stderr
            )
        assert not [r for r in G_refs(runners.url, runners.world.project).splitlines() if "/req/" in r]
        runners.env["KAKEYA_ISOLATION"] = "userns"  # the admin names it: it serves, and says what it lacks
        if not user:  # ... but not as root: its runs would hold root's files, the venv among them
            refused = subprocess.run(
                runners.argv("once", "named"),
                env=runners.env,
                cwd=runners.home,
                capture_output=True,
                text=True,
            )
            assert refused.returncode != 0 and refused.stderr.strip().splitlines()[-1].startswith(
                "kakeya: error: refusing"
            ), refused.stderr
            assert "refusing to serve: as root, isolation userns runs each program with root's own files" in (
                refused.stderr
            )
            for name in ("none", "userns"):
                runners.env["KAKEYA_ISOLATION"] = name
                said = subprocess.run(
                    runners.wrap([sys.executable, "-m", "bridge.cli", "exec", "hog", "-p", "mode=host"]),
                    env=runners.env,
                    cwd=project,
                    capture_output=True,
                    text=True,
                )
                assert f"refusing to run: as root, isolation {name} runs each" in said.stderr, said.stderr
            assert all(not Path(d, "kakeya-evil.pth").exists() for d in runners.dirs)
            return
        runners.start("named")
        result, stdout = result_of(runners, request(runners, "hog", {"mode": "host"}))
        log = runners.log()
        assert result["status"] == "succeeded" and result["isolation"] == "userns", result
        assert "isolation userns, network none; it does not protect the runner's own files" in log, log
        assert all(f"refused {d}" in stdout for d in runners.dirs), stdout  # the venv is root's
    finally:
        for d in runners.dirs:
            Path(d, "kakeya-evil.pth").unlink(missing_ok=True)
        runners.close()


@pytest.mark.skipif(not ROOT, reason="a run user other than the runner's needs a root runner")
def test_a_run_user_that_cannot_start_the_runners_python_is_refused_with_the_fix(world: Env, daemon: Daemon):
    closed = Path(tempfile.mkdtemp(prefix="kakeya-closed-"))  # mode 700: the run user may not pass
    try:
        venv = closed / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        python = venv / "bin" / "python"
        own = subprocess.run(
            [str(python), "-c", "import site; print(site.getsitepackages()[0])"],
            capture_output=True,
            text=True,
        )
        Path(own.stdout.strip(), "runner-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("KAKEYA_")} | {
            "PYTHONPATH": str(REPO),
            "KAKEYA_ISOLATION": "user",
            "KAKEYA_RUN_USER": str(RUN_UID),
            "KAKEYA_PRESETS": str(world.presets),
        }
        want = f"the run user uid {RUN_UID} cannot start {python}"
        fix = f"make the interpreter readable (chmod o+rx {closed}) or use a Python outside {closed}"
        watch = [
            str(python),
            "-m",
            "bridge.cli",
            "runner",
            "watch",
            "--labels",
            "cpu",
            "--remote",
            daemon.repo(),
        ]
        proc = subprocess.run(
            showing_python([*watch, "--workdir", str(closed / "w")]),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode != 0 and want in proc.stderr and fix in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()[-1]) < 600

        def run_doctor() -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                showing_python([str(python), "-m", "bridge.cli", "doctor"]),
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                cwd=world.project,
            )

        doctor = run_doctor()
        line = next(ln for ln in doctor.stdout.splitlines() if "isolation" in ln)
        assert line.startswith("FAIL  isolation") and want in line and fix in line, doctor.stdout
        closed.chmod(0o755)  # the fix: the trial starts
        doctor = run_doctor()
        assert f"ok    isolation user (uid {RUN_UID})" in doctor.stdout, doctor.stdout
    finally:
        shutil.rmtree(closed, ignore_errors=True)


def test_the_launcher_knows_a_limit_by_how_the_program_ended():
    from bridge.run import launcher

    class Tail:
        def __init__(self, text: bytes):
            self.tail = text

        refused = launcher.StderrTail.refused

        class thread:  # noqa: N801 (a joined thread)
            @staticmethod
            def join(timeout: float) -> None:
                pass

    limits = {"memory": 1 << 28, "file": 1 << 26}
    oom, no_oom = (4, 5), (4, 4)
    assert launcher.reached(-9, False, oom, None, limits) == (
        "memory",
        "it was killed by SIGKILL as the kernel's OOM killer ran",
    )
    assert launcher.reached(-9, True, oom, None, limits) is None  # the launcher's own kill (time limit)
    assert launcher.reached(-9, False, no_oom, None, limits) is None  # someone's kill -9
    assert launcher.reached(-25, False, no_oom, None, limits)[0] == "file"
    traceback = b'Traceback (most recent call last):\n  File "x.py", line 1\nMemoryError\n'
    assert launcher.reached(1, False, no_oom, Tail(traceback), limits)[0] == "memory"
    assert launcher.reached(0, False, no_oom, Tail(traceback), limits) is None
    assert launcher.reached(1, False, no_oom, Tail(traceback), {"file": 1}) is None  # no memory limit set
    earlier = b"MemoryError\n" + b"".join(b"line %d\n" % i for i in range(10))
    assert launcher.reached(1, False, no_oom, Tail(earlier), limits) is None


@pytest.mark.parametrize("isolation", ["none", "userns"])
def test_an_unprivileged_runner_whose_runs_could_write_its_code_refuses_to_start(
    world: Env, daemon: Daemon, isolation: str
):
    """Under none and userns a run is the runner's own user: where that user can write the bridge (here a
    copy it owns, as a `pip install --user` or a checkout of its own would be), a run could change what every
    later run and client executes, so `runner once` and `runner watch` refuse, naming the path; on code it
    cannot write (the repository, root's) the same runner starts."""
    runners = setup_world(world, isolation, TEST_USER, daemon)
    try:
        own = runners.home / "code"
        for pkg in ("bridge", "gates"):
            shutil.copytree(REPO / pkg, own / pkg, ignore=shutil.ignore_patterns("__pycache__"))
        ids = pwd.getpwnam(TEST_USER)
        for p in [own, *own.rglob("*")]:
            os.chown(p, ids.pw_uid, ids.pw_gid)
        for mode in ("once", "watch"):
            env = runners.env | {"PYTHONPATH": str(own)}
            proc = subprocess.run(
                runners.argv(mode, f"mine-{mode}"), env=env, cwd=runners.home, capture_output=True, text=True,
                timeout=120,
            )  # fmt: skip
            assert proc.returncode != 0, proc.stdout + proc.stderr
            said = proc.stderr.strip().splitlines()[-1]
            assert said.startswith(f"kakeya: error: refusing to serve: a run (isolation {isolation})") and (
                f"{own / 'bridge'}" in said and "make them writable by another user" in said
            ), said
        served = subprocess.run(
            runners.argv("once", "theirs"), env=runners.env, cwd=runners.home, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        assert served.returncode == 0, served.stdout + served.stderr
    finally:
        runners.close()
