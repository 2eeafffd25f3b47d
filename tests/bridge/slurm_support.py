"""A real single-node Slurm for the Slurm executor's tests: munged, slurmctld and slurmd from Debian's
packages (`munge slurmctld slurmd slurm-client`), all state in one scratch directory, no systemd, no
cgroups, no database, and 8 fake GPUs (character devices like /dev/null, declared in gres.conf).

`Cluster.start()` raises `ClusterUnavailable` with the reason when it cannot come up (not root, packages
missing, a daemon that will not start); the `slurm` fixture (conftest.py) turns that into a skip.
`stop()` kills the daemons and every process a job left (without cgroups, job processes outlive slurmd).

Facts behind each setting: shared/SLURM-FACTS.md.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

PACKAGES = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")
GPUS = 8
NODE = "node1"
GPU_TYPE = "h200"
PARTITION = "gpu"


class ClusterUnavailable(Exception):
    """Why a test cluster cannot come up here."""


SLURM_CONF = """\
ClusterName=kakeya-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
MailProg=/bin/true
KillWait=5
MinJobAge=3600
ReturnToService=2
SlurmdTimeout=10
InactiveLimit=0
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc={d}/jobcomp.txt
NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=4000 Gres=gpu:{gpu_type}:{gpus} State=UNKNOWN
PartitionName={partition} Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    """True for a running process (a zombie is not: a daemon re-parented to a non-reaping init stays one)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


class Cluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.socket"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.env: dict[str, str] = {}

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> Cluster:
        if os.geteuid() != 0:
            raise ClusterUnavailable("a test Slurm needs root (slurmd runs jobs as their submitting user)")
        missing = [p for p in PACKAGES if not shutil.which(p, path=os.environ.get("PATH", "") + ":/usr/sbin")]
        if missing:
            raise ClusterUnavailable(
                f"Slurm is not installed ({', '.join(missing)} missing): "
                "apt-get install -y --no-install-recommends munge slurmctld slurmd slurm-client"
            )
        self._write_files()
        try:
            self._start_munge()
            self._start_daemons()
        except ClusterUnavailable:
            self.stop()
            raise
        return self

    def _write_files(self) -> None:
        d = self.root
        for sub in ("munge", "state", "spool", "gpus"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        d.chmod(0o755)
        (d / "munge").chmod(0o755)
        for i in range(GPUS):
            dev = d / "gpus" / f"nvidia{i}"
            if not dev.exists():
                os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))  # a character device like /dev/null
        host = socket.gethostname().split(".")[0]
        self.conf.write_text(
            SLURM_CONF.format(
                host=host,
                d=d,
                ctld_port=_free_port(),
                slurmd_port=_free_port(),
                munge_socket=self.munge_socket,
                node=NODE,
                cpus=max(os.cpu_count() or 1, GPUS),
                gpus=GPUS,
                gpu_type=GPU_TYPE,
                partition=PARTITION,
            )
        )
        (d / "gres.conf").write_text(
            f"AutoDetect=off\nNodeName={NODE} Name=gpu Type={GPU_TYPE} File={d}/gpus/nvidia[0-{GPUS - 1}]\n"
        )
        self.env = {"SLURM_CONF": str(self.conf)}

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{name}.out", "ab")  # noqa: SIM115 (the daemon holds it)
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.env},
            start_new_session=True,
        )
        log.close()
        self.procs[name] = proc
        return proc

    def _start_munge(self) -> None:
        key = self.root / "munge" / "key"
        if not key.exists():
            subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
        key.chmod(0o600)
        self._spawn(
            "munged",
            [
                "munged",
                "-F",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--log-file={self.root / 'munge' / 'munged.log'}",
                f"--pid-file={self.root / 'munge' / 'munged.pid'}",
                f"--seed-file={self.root / 'munge' / 'munged.seed'}",
            ],
        )
        self._wait(lambda: self.munge_socket.exists(), 10, "munged", "munge/munged.log")

    def _start_daemons(self) -> None:
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self.start_slurmd()

    def start_slurmd(self) -> None:
        self._spawn("slurmd", ["slurmd", "-D", "-N", NODE, "-f", str(self.conf)])
        self._wait(self._idle, 30, "slurmd/slurmctld", "slurmctld.log")

    def _idle(self) -> bool:
        out = self.run("sinfo", "-h", "-n", NODE, "-o", "%t", check=False)
        return out.strip() in ("idle", "mix", "alloc")

    def _wait(self, ready: object, timeout: float, what: str, log: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():  # type: ignore[operator]
                return
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise ClusterUnavailable(f"{name} exited ({proc.returncode}): {self._tail(name)}")
            time.sleep(0.2)
        raise ClusterUnavailable(f"{what} not ready in {timeout} s: {self._tail(log)}")

    def _tail(self, name: str) -> str:
        for path in (self.root / name, self.root / f"{name}.out", self.root / f"{name}.log"):
            if path.is_file():
                return " | ".join(path.read_text(errors="replace").splitlines()[-5:])
        return "(no log)"

    def kill_slurmd(self) -> None:
        """A node failure: slurmd dies with SIGKILL (its jobs' processes live on, as on a real node)."""
        proc = self.procs.pop("slurmd")
        proc.kill()
        proc.wait()

    def stop(self) -> None:
        """Cancel every job, kill the daemons, then every process a job left behind."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.run("scancel", "--full", "-u", "root", check=False, timeout=10)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is None:
                continue
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.kill_job_processes()

    def kill_job_processes(self) -> None:
        """Without cgroups, slurmstepd and the job's processes can outlive slurmd: every process whose
        environment names this cluster's config dies."""
        marker = f"SLURM_CONF={self.conf}".encode()
        spared = {os.getpid(), *(p.pid for p in self.procs.values())}  # the daemons still wanted
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in spared:
                continue
            try:
                environ = (entry / "environ").read_bytes()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if (
                marker in environ.split(b"\0")
                or b"slurmstepd" in cmdline
                and str(self.root).encode() in cmdline
            ):
                try:
                    os.kill(int(entry.name), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    # -- clients ---------------------------------------------------------------------------------------
    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> str:
        proc = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            env={**os.environ, **self.env},
            timeout=timeout,
        )
        if check and proc.returncode:
            raise RuntimeError(f"{argv}: {proc.stderr.strip()}")
        return proc.stdout

    def alive(self, name: str) -> bool:
        proc = self.procs.get(name)
        return proc is not None and _alive(proc.pid)
