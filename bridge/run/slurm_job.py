"""The inside of a Kakeya Slurm job (the batch script execs it; bridge/run/slurm.py writes both):

    PYTHON -I bridge/run/slurm_job.py CONTROL_DIR

It reads CONTROL_DIR/job.json (the program's argv and environment, the subject's export, the log cap, the
isolation asked for) and deletes it (the environment, secrets included, never passes through Slurm:
slurmctld stores a job's script and submit environment). On the node it chooses the isolation as a local
run does (bridge/run/isolation.py's `choose`: a bubblewrap sandbox where the node has bubblewrap) and makes the
program's private directories in CONTROL_DIR/sandbox (its own copy of the subject in work/, its run
directory out/, HOME, TMPDIR; owned by the run user under a root job), records what Slurm allocated and the
isolation (CONTROL_DIR/alloc.json: job id, node, GPUs, their names where nvidia-smi answers), then runs the
program under bridge/run/launcher.py inside that sandbox (the launcher writes its exit status on a pipe, out of
the program's reach, written to CONTROL_DIR/launcher.json, the status the runner reads, once it exited) with
stdout/stderr capped into OUT_DIR/logs. A sandboxed program sees nothing of CONTROL_DIR but sandbox/, nor
the runner's state directory, keys or the job's files. At SIGTERM (scancel, the time limit) it closes the
launcher's lifeline: the launcher ends the program's whole tree (setsid'd daemons included) and still
writes its status.

Run with `python -I` by path: the subject's PYTHONPATH never reaches it; Kakeya's own modules are imported
from beside this file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # Kakeya's own modules, never the subject's (`python -I`)

from bridge.core import logs  # noqa: E402
from bridge.core.errors import KakeyaError  # noqa: E402
from bridge.presets.preset import Limits  # noqa: E402
from bridge.run import launcher  # noqa: E402
from bridge.run.execute import copy_subject, launcher_status, private_dirs  # noqa: E402
from bridge.run.isolation import (  # noqa: E402
    ROOT_RUNS_FOR_TESTS,
    Isolation,
    bwrap_argv,
    choose,
    key_problem,
    root_problem,
    run_limits,
)

# What Slurm tells the job about its allocation, passed on to the program.
ALLOCATION_VARS = ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS", "GPU_DEVICE_ORDINAL", "SLURM_JOB_ID")


def gpu_names() -> list[str]:
    """The allocated GPUs' names (nvidia-smi sees only CUDA_VISIBLE_DEVICES' devices); [] without one."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def write_status(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def allocation() -> dict[str, object]:
    """What Slurm allocated the job (its environment) and the GPUs' names."""
    return {
        "job_id": os.environ.get("SLURM_JOB_ID"),
        "node": os.environ.get("SLURMD_NODENAME"),
        "partition": os.environ.get("SLURM_JOB_PARTITION"),
        "gpus": [g for g in os.environ.get("SLURM_JOB_GPUS", "").split(",") if g],
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "gpu_names": gpu_names(),
    }


def sandbox(spec: dict, scratch: Path) -> tuple[Isolation, Path]:
    """The isolation a local run would get on this node, and the program's own directories; where it runs."""
    iso = choose(spec["isolation"], spec["run_user"], network_none=bool(spec["network_none"]))
    cwd = private_dirs(Path(spec["checkout"]), scratch, iso)
    if cwd != scratch / "work":  # no private copy under this isolation: the same paths all the same
        copy_subject(Path(spec["checkout"]), scratch / "work")
        (scratch / "out").mkdir()
        cwd = scratch / "work"
    return iso, cwd


def refusal(spec: dict, iso: Isolation, env: dict[str, str]) -> str | None:
    """Why the program must not run on this node (a signing runner's key within its reach; a root job under
    none or userns), or None."""
    where = os.environ.get("SLURMD_NODENAME") or "the node"
    if problem := key_problem(spec.get("signing_key"), iso, env):
        # a signing runner's key and evidence are only as safe as the sandbox the node gave
        return (
            f"refused to run the program: {where} gave it isolation {iso.describe} and this runner signs its "
            f"results: {problem}. On a Slurm label install bubblewrap on the compute nodes and keep the key "
            'on a path only the runner\'s host can read (docs/runners.md, "A Slurm cluster")'
        )
    tests = {ROOT_RUNS_FOR_TESTS: "1"} if spec.get("root_runs_for_tests") else {}
    if as_root := root_problem(iso, tests):  # the job is root's: its program must not be
        return f"refused to run the program: {where} runs the job as root, and {as_root}"
    return None


def launcher_argv(spec: dict, iso: Isolation, lifeline: int, status: int) -> list[str]:
    """The launcher's command line: the run user, and the preset's limits with this node's defaults."""
    ids = ["--uid", str(iso.uid), "--gid", str(iso.gid)] if iso.uid is not None else []
    ids += run_limits(Limits(**(spec.get("limits") or {})), iso).launcher_args()
    return [
        *iso.wrap,
        *(sys.executable, "-I", launcher.__file__, "--status-fd", str(status)),
        *("--lifeline", str(lifeline), *ids, "--", *spec["argv"]),
    ]


def run_capped(argv: list[str], cwd: Path, env: dict[str, str], spec: dict, fds: tuple[int, ...]) -> int:
    """Run the launcher, its stdout and stderr capped into OUT_DIR/logs; its exit status."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=fds,
    )
    for fd in fds:
        os.close(fd)
    log_dir = Path(spec["out_dir"]) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    pumps = [
        threading.Thread(
            target=logs.pump,
            args=(stream, logs.CappedLog(log_dir / name, int(spec["log_cap_bytes"]), logs.Redactor([]))),
        )
        for stream, name in ((proc.stdout, "stdout.log"), (proc.stderr, "stderr.log"))
    ]
    for t in pumps:
        t.start()
    proc.wait()  # PEP 475: a signal's handler runs and the wait goes on
    for t in pumps:
        t.join()
    return proc.returncode


def main(argv: list[str]) -> int:
    control = Path(argv[1])
    spec_path = control / "job.json"
    spec = json.loads(spec_path.read_text())
    spec_path.unlink()
    status = control / "launcher.json"
    env: dict[str, str] = dict(spec["env"])
    env.update({k: os.environ[k] for k in ALLOCATION_VARS if k in os.environ})
    alloc = allocation()
    scratch = control / "sandbox"
    try:
        iso, cwd = sandbox(spec, scratch)
    except (KakeyaError, OSError) as exc:
        (control / "alloc.json").write_text(json.dumps(alloc))
        write_status(status, {"exit_code": None, "start_error": f"the node's sandbox: {exc}"})
        return 0
    alloc.update(isolation=iso.describe, network=iso.network)
    (control / "alloc.json").write_text(json.dumps(alloc))
    if why := refusal(spec, iso, env):
        write_status(status, {"exit_code": None, "refused": why})
        return 0
    if iso.kind == "bwrap":
        iso = dataclasses.replace(iso, wrap=bwrap_argv(iso, scratch, cwd, env))
    lifeline_r, lifeline_w = os.pipe()
    stop = threading.Event()

    def on_signal(_signum: int, _frame: object) -> None:
        if not stop.is_set():
            stop.set()
            os.close(lifeline_w)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    inner, status_w = os.pipe()  # the launcher's word: never a file the program could plant something at
    argv_ = launcher_argv(spec, iso, lifeline_r, status_w)
    returncode = run_capped(argv_, cwd, env, spec, (lifeline_r, status_w))
    if not stop.is_set():
        os.close(lifeline_w)
    word = launcher_status(inner) if returncode == 0 else None
    if not word:  # the launcher (or its sandbox) was killed: whatever it left is not its word
        word = {"exit_code": None, "lost": f"the launcher was killed ({returncode})"}
    write_status(status, word)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
