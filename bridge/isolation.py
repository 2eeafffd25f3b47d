"""How a run is kept away from the runner: the identity and namespaces its processes get.

    none     the run is the runner's user (its environment is scrubbed, its HOME is private, nothing more)
    user     Linux/macOS, runner started as root: the launcher starts the program as `run_user` (a dedicated
             unprivileged user, e.g. `useradd --system kakeya-run`, or a bare uid), in a copy of the checkout
             under a private run directory; the runner's environment (/proc/<pid>/environ), files, git
             credentials and keys are another user's, so the program cannot read them
    userns   Linux, any user: `unshare --user --pid --fork --mount-proc`: the program cannot see the runner's
             processes (nor their environment); the runner's files stay readable (use `user` for those)
    auto     `user` when the runner is root, else `userns` when the kernel allows it, else none

`network: none` on a preset adds a new, empty network namespace (`unshare -n`) where permitted.
What was chosen is recorded in result.json (`isolation`, `network`); `kakeya doctor` shows it.
"""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from bridge.errors import KakeyaError

UNSHARE_USERNS = ["unshare", "--user", "--pid", "--fork", "--mount-proc"]


@dataclass(frozen=True)
class Isolation:
    kind: str  # none | user | userns
    uid: int | None = None
    gid: int | None = None
    wrap: list[str] = field(default_factory=list)  # argv prefix (unshare ...) for the launcher
    network: str = "host"  # host | none

    @property
    def describe(self) -> str:
        who = f" (uid {self.uid})" if self.uid is not None else ""
        return f"{self.kind}{who}"


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
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    ids = run_user_ids(run_user) if root else None
    kind = mode
    if mode == "auto":
        kind = "user" if ids and ids[0] != 0 else ("userns" if userns_available() else "none")
    wrap: list[str] = []
    if kind == "user":
        if not root:
            raise KakeyaError(
                "isolation 'user' needs the runner to start as root (it then runs each program as "
                f"{run_user!r}); use isolation 'userns', or start the runner as root"
            )
        if ids is None or ids[0] == 0:
            raise KakeyaError(
                f"isolation 'user': no user {run_user!r} on this host; create it with "
                "`useradd --system --no-create-home kakeya-run`, or set run_user / KAKEYA_RUN_USER (a name or a uid)"
            )
    elif kind == "userns":
        if not userns_available():
            raise KakeyaError(
                "isolation 'userns': `unshare --user --pid` is not permitted here "
                "(kernel.unprivileged_userns_clone / a container policy); use isolation 'user' or 'none'"
            )
        wrap = list(UNSHARE_USERNS)
    network = "host"
    if network_none:
        if kind == "userns":
            wrap.append("--net")
            network = "none"
        elif netns_available(rootless=not root):
            wrap = ["unshare", "--net"] if root else ["unshare", "--user", "--map-root-user", "--net"]
            network = "none"
        else:
            network = "host (network: none is not permitted on this host)"
    uid, gid = ids if kind == "user" and ids else (None, None)
    return Isolation(kind, uid, gid, wrap, network)
