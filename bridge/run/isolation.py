"""How a run is kept away from the runner: the sandbox, identity and namespaces its processes get.

    bwrap    Linux, bubblewrap installed (Debian/Ubuntu `bubblewrap`, what Flatpak is built on), root or not:
             new user (non-root runner), PID, IPC and UTS namespaces, `--die-with-parent`; the run sees a
             read-only system (/usr, /lib*, a few files of /etc, /sys), its own private scratch (its copy of
             the subject, its run directory, HOME and TMPDIR), the venv and the models directories
             read-only, and nothing else: the runner's home, state directory, mirror, config, secrets and
             keys are not there. A root runner also starts the program as `run_user` inside (`nobody` when
             that user does not exist: inside the sandbox nothing of nobody's is visible, and the program can
             signal no process outside its PID namespace). When the launcher dies the namespace's init exits
             and the kernel kills everything left in it.
    user     Linux/macOS, runner started as root: the launcher starts the program as `run_user` (a dedicated
             unprivileged user, e.g. `useradd --system kakeya-run`, or a bare uid) in a copy of the subject
             under a private run directory; the runner's environment, files, git credentials and keys are
             another user's, so the program cannot read them (world-readable files stay readable)
    userns   Linux, any user: `unshare --user --pid --fork --mount-proc`: the program cannot see the runner's
             processes (nor their environment); the runner's files stay readable and writable (use bwrap)
    none     the run is the runner's user (its environment is scrubbed, its HOME is private, nothing more):
             for trusted subjects only, and only when asked for by name
    auto     the strongest the host offers: bwrap, else user (root with run_user), else userns, else none

`auto` never settles in silence for userns or none: a runner (and `kakeya run`, `kakeya exec`) refuses to serve
(`weak_problem`) until the admin names it; a root runner refuses none and userns whoever named them (its runs
would be root, or hold root's files, and could change the venv and all the runner executes). In the bwrap sandbox /tmp and /dev/shm are directories of the run's scratch (on disk, not a tmpfs of
the host's memory). A preset's `network: none` (the default) gives the run a new network namespace with its
own loopback alone, where permitted (`network: host` asks for the host's). `run_limits`: the memory, process
and file-size limits the launcher sets on the program. What was chosen is recorded in result.json
(`isolation`, `network`); `kakeya doctor` shows it, and `trial` starts `python -c` as a run does, at doctor
and `runner watch` (the run user must be able to start the venv's Python, and not write to it).
`key_problem` says when a signing key is within a run's reach (the runner then refuses to start).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pwd
import shutil
import site
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bridge.core.errors import KakeyaError
from bridge.presets.params import models_dirs
from bridge.presets.preset import Limits
from bridge.run import launcher

UNSHARE_USERNS = ["unshare", "--user", "--pid", "--fork", "--mount-proc"]
NOBODY = "nobody"
# What of /etc a program may need (names, DNS, TLS roots, time zone, the dynamic linker, alternatives).
ETC = (
    "passwd",
    "group",
    "nsswitch.conf",
    "hosts",
    "host.conf",
    "resolv.conf",
    "gai.conf",
    "services",
    "protocols",
    "localtime",
    "timezone",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "pki",
    "crypto-policies",
    "mime.types",
    "os-release",
    "debian_version",
    "fonts",
)
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/sys")
# Accelerator devices a program may open (those present are bound).
DEVICES = ("/dev/nvidia*", "/dev/nvidia-caps", "/dev/dri", "/dev/kfd")
# The launcher inside a root sandbox keeps only these (to become run_user and end what the run left).
ROOT_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL")


@dataclass(frozen=True)
class Isolation:
    kind: str  # none | user | userns | bwrap
    uid: int | None = None  # the program's uid when the launcher changes it (a root runner)
    gid: int | None = None
    wrap: list[str] = field(default_factory=list)  # argv prefix (unshare ...) for the launcher
    network: str = "host"  # host | none
    note: str = ""  # e.g. why uid 65534

    @property
    def describe(self) -> str:
        who = f" (uid {self.uid}{', ' + self.note if self.note else ''})" if self.uid is not None else ""
        return f"{self.kind}{who}"

    @property
    def private(self) -> bool:
        """Does the program get its own copy of the subject and its own run directory (in the scratch)?"""
        return self.kind in ("user", "bwrap")

    @property
    def root(self) -> bool:
        return self.kind in ("user", "bwrap") and self.uid is not None


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


@functools.cache
def _works(*argv: str) -> bool:
    if not sys.platform.startswith("linux") or shutil.which(argv[0]) is None:
        return False
    try:
        return subprocess.run([*argv, "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def userns_available() -> bool:
    return _works(*UNSHARE_USERNS)


def netns_available(rootless: bool) -> bool:
    return _works("unshare", "--user", "--map-root-user", "--net") if rootless else _works("unshare", "--net")


def bwrap_available() -> bool:
    """bubblewrap is installed and may make a sandbox here (as this user)."""
    return _works(*_namespaces(_is_root()), *_system_binds(), "--proc", "/proc", "--dev", "/dev", "--")


def run_user_ids(name: str) -> tuple[int, int] | None:
    """(uid, gid) of `name` (a user name or a bare uid), None when there is no such user."""
    if name.isdigit():
        uid = int(name)
        try:
            return uid, pwd.getpwuid(uid).pw_gid
        except KeyError:
            return uid, uid
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


def choose(mode: str, run_user: str, network_none: bool = False) -> Isolation:
    """The isolation for one run; KakeyaError when `mode` asks for what this host cannot give."""
    root = _is_root()
    ids = run_user_ids(run_user) if root else None
    if ids is not None and ids[0] == 0:
        ids = None
    kind = mode
    if mode == "auto":
        if bwrap_available():
            kind = "bwrap"
        elif root and ids:
            kind = "user"
        else:
            kind = "userns" if userns_available() else "none"
    wrap: list[str] = []
    note = ""
    if kind == "bwrap":
        if not bwrap_available():
            raise KakeyaError(
                "isolation 'bwrap': bubblewrap is not installed or may not make a sandbox here; install it "
                "(`apt-get install bubblewrap` / `dnf install bubblewrap`, or scripts/setup-runner.sh), or "
                "choose isolation auto"
            )
        if root and ids is None:
            nobody = run_user_ids(NOBODY)
            ids, note = (nobody or (65534, 65534)), f"nobody: no user {run_user!r}"
    elif kind == "user":
        if not root:
            raise KakeyaError(
                "isolation 'user' needs the runner to start as root (it then runs each program as "
                f"{run_user!r}); use isolation 'bwrap' or 'auto', or start the runner as root"
            )
        if ids is None:
            raise KakeyaError(
                f"isolation 'user': no user {run_user!r} on this host; create it with "
                "`useradd --system --no-create-home kakeya-run`, or set run_user / KAKEYA_RUN_USER (a name or a uid)"
            )
    elif kind == "userns":
        if not userns_available():
            raise KakeyaError(
                "isolation 'userns': `unshare --user --pid` is not permitted here "
                "(kernel.unprivileged_userns_clone / a container policy); use isolation 'bwrap' or 'user'"
            )
        wrap = list(UNSHARE_USERNS)
    elif kind != "none":
        raise KakeyaError(f"unknown isolation {mode!r}: none | auto | bwrap | user | userns")
    network = "host"
    if network_none:
        if kind in ("bwrap", "userns"):  # bwrap_argv adds --unshare-net
            wrap += ["--net"] if kind == "userns" else []
            network = "none"
        elif netns_available(rootless=not root):
            wrap = ["unshare", "--net"] if root else ["unshare", "--user", "--map-root-user", "--net"]
            network = "none"
        else:
            network = "host (network: none is not permitted on this host)"
    uid, gid = ids if kind in ("user", "bwrap") and ids else (None, None)
    return Isolation(kind, uid, gid, wrap, network, note)


# --- the bubblewrap sandbox ---------------------------------------------------------------------------


def _namespaces(root: bool) -> list[str]:
    argv = ["bwrap", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent"]
    if root:  # no user namespace (it would map the program to uid 0 outside); the launcher drops to run_user
        argv += ["--cap-drop", "ALL", *(a for cap in ROOT_CAPS for a in ("--cap-add", cap))]
    else:
        argv += ["--unshare-user"]
    return argv


def _system_binds() -> list[str]:
    argv: list[str] = []
    for top in SYSTEM:
        path = Path(top)
        if path.is_symlink():
            argv += ["--symlink", os.readlink(path), top]
        elif path.is_dir():
            argv += ["--ro-bind", top, top]
    # /etc made 0755 (bwrap would make it 0700: a root runner's run user could not read what is bound there)
    argv += ["--perms", "0755", "--dir", "/etc"]
    for name in ETC:
        if (Path("/etc") / name).exists():
            argv += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    return argv


def exposed(environ: Mapping[str, str]) -> list[Path]:
    """What a bwrap sandbox shows read-only besides the system: the venv, its base interpreter, the models
    directories and the launcher."""
    paths = [Path(sys.prefix), Path(sys.base_prefix), Path(os.path.realpath(sys.executable)).parent.parent]
    paths += [d for d in models_dirs(environ) if d.is_dir()]
    paths.append(Path(launcher.__file__))
    out: list[Path] = []
    for p in [q for path in paths for q in (Path(os.path.abspath(path)), Path(os.path.realpath(path)))]:
        if p.exists() and not _covered(p, [Path(s) for s in SYSTEM]) and p not in out:
            out.append(p)
    return out


def _covered(path: Path, roots: Iterable[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def bwrap_argv(iso: Isolation, scratch: Path, cwd: Path, environ: Mapping[str, str]) -> list[str]:
    """bwrap's argv (up to and including `--`) for a run whose every writable file is under `scratch`."""
    argv = _namespaces(iso.root)
    if iso.network == "none":
        argv.append("--unshare-net")
    argv += _system_binds()
    # /tmp and /dev/shm are directories of the run's scratch, on its disk: never a tmpfs of the host's memory
    # (bwrap 0.8 cannot size one), so what a run puts there is files, bounded as its other files are.
    for sub in ("tmp", "shm"):
        (scratch / sub).mkdir(exist_ok=True)
        (scratch / sub).chmod(0o1777)
    argv += ["--proc", "/proc", "--dev", "/dev", "--bind", str(scratch / "shm"), "/dev/shm"]
    for pattern in DEVICES:
        for dev in sorted(Path("/").glob(pattern.lstrip("/"))):
            argv += ["--dev-bind", str(dev), str(dev)]
    argv += ["--bind", str(scratch / "tmp"), "/tmp"]
    ro = exposed(environ)
    made: set[Path] = {Path("/"), Path("/tmp"), Path("/dev"), *(Path(s) for s in SYSTEM)}
    for target in [*ro, scratch]:
        for parent in reversed(
            target.parents
        ):  # bwrap would make them 0700: the program's uid could not pass
            if parent not in made and not _covered(parent, [*ro, *(Path(s) for s in SYSTEM)]):
                argv += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
    for path in ro:
        argv += ["--ro-bind", str(path), str(path)]
    argv += ["--bind", str(scratch), str(scratch), "--chdir", str(cwd), "--"]
    return argv


# --- what a run may use of the host ------------------------------------------------------------------

DEFAULT_PROCESSES = 4096  # tasks (threads count) of the run's user
DEFAULT_FILE_MB = 64 * 1024
LIMIT_NAMES = {"memory": "memory_mb", "processes": "processes", "file": "file_mb"}


def host_memory_mb() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (1 << 20)
    except (ValueError, OSError):
        return 1 << 20


@dataclass(frozen=True)
class RunLimits:
    """What one run may use (from the preset's `limits`, else the defaults): memory per process (MiB), tasks
    of its user (None: not enforceable under this isolation, where the program runs as the runner's own user
    or as root), the largest file (MiB)."""

    memory_mb: int
    processes: int | None
    file_mb: int

    def launcher_args(self) -> list[str]:
        argv = ["--memory", str(self.memory_mb << 20), "--file", str(self.file_mb << 20)]
        return argv + (["--processes", str(self.processes)] if self.processes is not None else [])

    def reached(self, which: str, why: str | None = None) -> str:
        """The reason of a run that reached limit `which` (`why`: what showed it, the launcher's words)."""
        if which == "memory":
            what = f"its memory limit of {self.memory_mb} MiB per process (limits.memory_mb)"
        elif which == "processes":
            what = f"its limit of {self.processes} processes and threads (limits.processes)"
        else:
            what = f"its limit of {self.file_mb} MiB per file, /tmp's too (limits.file_mb)"
        return f"the run reached {what}{': ' + why if why else ''}; the preset may raise it"


def limit_reason(word: Mapping[str, object], asked: RunLimits | None) -> str | None:
    """The reason of a run whose launcher said (its status `word`) it reached a limit, or None: the limit's
    value as the launcher set it (`limits`, in bytes), else as asked."""
    which, set_ = word.get("limit"), word.get("limits")
    if which not in LIMIT_NAMES:
        return None
    set_ = set_ if isinstance(set_, dict) else {}
    value = set_.get(which)
    if isinstance(value, int) and not isinstance(value, bool):
        value = value >> 20 if which != "processes" else value
        base = asked or RunLimits(0, None, 0)
        asked = dataclasses.replace(base, **{LIMIT_NAMES[which]: value})
    if asked is None:
        return None
    why = word.get("why")
    return asked.reached(str(which), why[:200] if isinstance(why, str) else None)


def run_limits(limits: Limits, iso: Isolation) -> RunLimits:
    """A run's limits under `iso`: the preset's, else the defaults (memory: 3/4 of the host's, per process)."""
    own_user = iso.kind in ("bwrap", "user", "userns")  # a run user, or a user namespace, of the run's own
    return RunLimits(
        memory_mb=limits.memory_mb or host_memory_mb() * 3 // 4,
        processes=(limits.processes or DEFAULT_PROCESSES) if own_user else None,
        file_mb=limits.file_mb or DEFAULT_FILE_MB,
    )


# --- saying what is chosen, and trying it -------------------------------------------------------------

UNPROTECTED = {
    "bwrap": "the accelerators (shared with other runs), world-readable system files it is shown, and the "
    "host's network for presets with `network: host`",
    "user": "world-readable files, the host's /tmp and /dev/shm (shared memory, not bounded), the host's "
    "process list, and (where `unshare --net` is refused) the network",
    "userns": "the runner's own files (a run can read and write them: its state, its venv, its key), the "
    "host's /tmp and /dev/shm, and (where `unshare --net` is refused) the network",
    "none": "anything the runner's user can do: a run is the runner (trusted subjects only)",
}


# Kakeya's own test suite only (its containers run as root, its test programs are trusted and write the
# test's files): a root runner serves under isolation none or userns, its runs as root. Never on a runner.
ROOT_RUNS_FOR_TESTS = "KAKEYA_TEST_ROOT_RUNS"


def root_problem(iso: Isolation, environ: Mapping[str, str] | None = None) -> str | None:
    """Why a root runner (or a root Slurm job) must not run programs under `iso`: none and userns leave them
    root's files (the venv and all the runner executes), whoever named them; else None."""
    environ = os.environ if environ is None else environ
    if not _is_root() or iso.kind not in ("none", "userns") or environ.get(ROOT_RUNS_FOR_TESTS) == "1":
        return None
    return (
        f"as root, isolation {iso.kind} runs each program with root's own files (a run could change the "
        "runner's venv and everything the runner executes); install bubblewrap (apt-get install bubblewrap) "
        'and use isolation = "auto" or "bwrap", or isolation = "user" with a run user (useradd --system '
        "kakeya-run; run_user / KAKEYA_RUN_USER), or start the runner as an unprivileged user"
    )


def reach_problem(
    iso: Isolation, writable: list[str], environ: Mapping[str, str] | None = None
) -> str | None:
    """Why a runner must not start when a trial run (`trial`) could write to `writable`, what the runner
    executes: in every mode (a run could change the venv or the bridge and so every later run and client),
    save a root runner's none/userns that `root_problem` lets through for the test suite alone; else None."""
    environ = os.environ if environ is None else environ
    if not writable or (
        _is_root() and iso.kind in ("none", "userns") and environ.get(ROOT_RUNS_FOR_TESTS) == "1"
    ):
        return None
    owner = "by the runner's user alone (chmod go-w)" if iso.kind in ("bwrap", "user") else "by another user"
    return (
        f"a run (isolation {iso.describe}) could write to {', '.join(writable)}, which the runner executes; "
        f"make them writable {owner}"
        + (
            ""
            if iso.kind in ("bwrap", "user")
            else ", or give runs bubblewrap or a run user (isolation auto)"
        )
    )


def weak_problem(mode: str, iso: Isolation, environ: Mapping[str, str] | None = None) -> str | None:
    """Why a runner must not serve under `iso` chosen by `mode`, or None: auto fell to userns or none, or the
    runner is root and its runs would be too (`root_problem`)."""
    as_root = root_problem(iso, environ)
    if mode == "auto" and iso.kind not in ("bwrap", "user"):
        name = (
            f"as root, runs under {iso.kind} would hold root's files, so a run user or bubblewrap it must be"
            if as_root
            else f'or name the isolation: isolation = "{iso.kind}" (or "none") in kakeya.toml / KAKEYA_ISOLATION'
        )
        return (
            f"isolation auto found no bubblewrap and no run user here and would give runs only {iso.kind}, which "
            f"does not protect {UNPROTECTED[iso.kind]}; install bubblewrap (apt-get install bubblewrap), or, as "
            f"root, a run user (useradd --system kakeya-run), {name}"
        )
    return as_root


def describe_protection(iso: Isolation) -> str:
    """One line for the runner's start: the isolation and what it does not protect."""
    return f"isolation {iso.describe}, network {iso.network}; it does not protect {UNPROTECTED[iso.kind]}"


# Run by the trial as the run user, in the sandbox: which of the runner's directories (PATH:DEV:INODE, as the
# runner sees them) a run could write to. A directory of the same path that is not the same (a sandbox's own,
# made to hold a bound file) is the run's, not the runner's.
TRIAL_PY = (
    "import os, sys\n"
    "for arg in sys.argv[1:]:\n"
    "    path, dev, ino = arg.rsplit(':', 2)\n"
    "    try:\n"
    "        st = os.stat(path)\n"
    "    except OSError:\n"
    "        continue\n"
    "    if (st.st_dev, st.st_ino) == (int(dev), int(ino)) and os.access(path, os.W_OK):\n"
    "        print(path)\n"
)


def runner_paths() -> list[str]:
    """What the runner executes and a run must not change: the venv (its site-packages, bin, prefix), the base
    interpreter's prefix and standard library, and the bridge package (the launcher's layer, run/, and the
    package above it)."""
    bridge = Path(os.path.abspath(launcher.__file__)).parents[1]
    paths = [sys.prefix, os.path.dirname(sys.executable), *site.getsitepackages(), sys.base_prefix]
    paths += [os.path.dirname(os.__file__), str(bridge), str(bridge / "run")]
    return list(dict.fromkeys(os.path.realpath(p) for p in paths if os.path.isdir(p)))


def closed_to(path: Path, uid: int, gid: int) -> Path | None:
    """The first directory above `path` (as written, then its links resolved) that `uid` may not pass, or None."""
    given, real = Path(os.path.abspath(path)), Path(os.path.realpath(path))
    for parent in [*reversed(given.parents), *reversed(real.parents)]:
        try:
            st = os.stat(parent)
        except OSError:
            return parent
        bit = 0o100 if st.st_uid == uid else 0o010 if st.st_gid == gid else 0o001
        if not st.st_mode & bit:
            return parent
    return None


def trial(iso: Isolation, environ: Mapping[str, str]) -> list[str]:
    """Start `python -c` as a run starts (the launcher, the run user, the sandbox); KakeyaError with the fix
    when it cannot start; else which of the runner's paths (`runner_paths`) the run could write to."""
    scratch = Path(tempfile.mkdtemp(prefix="kakeya-trial-"))
    try:
        scratch.chmod(0o755)
        wrap = bwrap_argv(iso, scratch, scratch, environ) if iso.kind == "bwrap" else list(iso.wrap)
        ids = ["--uid", str(iso.uid), "--gid", str(iso.gid)] if iso.uid is not None else []
        status_r, status_w = os.pipe()  # the launcher's status, as a run's: on a pipe only we read
        argv = [*wrap, sys.executable, "-I", launcher.__file__, "--status-fd", str(status_w), *ids]
        seen = [f"{p}:{(st := os.stat(p)).st_dev}:{st.st_ino}" for p in runner_paths()]
        argv += ["--", sys.executable, "-I", "-c", TRIAL_PY, *seen]
        try:
            proc = subprocess.run(
                argv, capture_output=True, text=True, timeout=60, cwd=scratch, pass_fds=(status_w,)
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise KakeyaError(f"a trial run under isolation {iso.describe} could not start: {exc}") from None
        finally:
            os.close(status_w)
        try:
            os.set_blocking(status_r, False)
            try:
                said = os.read(status_r, 65536)
            except BlockingIOError:
                said = b""
            ended = json.loads(said)
            assert isinstance(ended, dict)
        except (OSError, ValueError, AssertionError):
            last = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
            raise KakeyaError(
                f"a trial run under isolation {iso.describe} could not start the launcher "
                f"({sys.executable} -I {launcher.__file__}): {last}"
            ) from None
        finally:
            os.close(status_r)
        if ended.get("start_error") or ended.get("exit_code") != 0:
            who = f"the run user uid {iso.uid}" if iso.uid is not None else "a run"
            why = ended.get("start_error") or (proc.stderr.strip().splitlines() or ["no output"])[-1]
            closed = (
                closed_to(Path(sys.executable), iso.uid, iso.gid or iso.uid) if iso.uid is not None else None
            )
            fix = (
                f"make the interpreter readable (chmod o+rx {closed}) or use a Python outside {closed}"
                if closed
                else "make the venv and its interpreter readable and executable by it"
            )
            exe = sys.executable + (
                f" ({real})" if (real := os.path.realpath(sys.executable)) != sys.executable else ""
            )
            raise KakeyaError(f"{who} cannot start {exe} (isolation {iso.describe}): {why}; {fix}")
        return [line for line in proc.stdout.splitlines() if line]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# --- keys out of reach ------------------------------------------------------------------------------


def readable_by(path: Path, uid: int, gid: int) -> bool:
    """Could `uid` (primary group `gid`, and its supplementary groups) read `path` (every directory above it
    searchable)?"""
    try:
        groups = {gid, *os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)}
    except KeyError:
        groups = {gid}

    def allowed(st: os.stat_result, bit: int) -> bool:
        if st.st_uid == uid:
            return bool(st.st_mode & (bit << 6))
        if st.st_gid in groups:
            return bool(st.st_mode & (bit << 3))
        return bool(st.st_mode & bit)

    path = Path(os.path.realpath(path))
    try:
        if not all(allowed(os.stat(p), stat.S_IXOTH) for p in reversed(path.parents)):
            return False
        return allowed(os.stat(path), stat.S_IROTH)
    except OSError:
        return False


def key_problem(key: str | None, iso: Isolation, environ: Mapping[str, str]) -> str | None:
    """Why a run could read the signing key `key` under `iso` (None: it cannot, or there is no key)."""
    if key is None:
        return None
    path = Path(os.path.realpath(key))
    fix = (
        "run the runner under isolation bwrap (auto where bubblewrap is installed) or, as root, user with a "
        "dedicated run_user, and keep the key readable by the runner's user alone (chmod 600), outside the "
        "venv and the models directories"
    )
    if iso.kind in ("none", "userns"):
        why = "runs as the runner's user" if iso.kind == "none" else "sees the runner's files"
        return f"signing key {path}: under isolation {iso.kind} a run {why} and could read it; {fix}"
    if iso.kind == "bwrap":
        inside = [p for p in exposed(environ) if _covered(path, [p])]
        if inside or _covered(path, [Path(s) for s in SYSTEM]) or str(path).startswith("/etc/"):
            where = inside[0] if inside else "the system directories"
            return f"signing key {path} lies under {where}, which the sandbox shows to every run; {fix}"
    if iso.uid is not None and readable_by(path, iso.uid, iso.gid if iso.gid is not None else iso.uid):
        return f"signing key {path} is readable by the run user (uid {iso.uid}); {fix}"
    return None
