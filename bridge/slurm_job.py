"""The inside of a Kakeya Slurm job (the batch script execs it; bridge/slurm.py writes both):

    PYTHON -I bridge/slurm_job.py CONTROL_DIR

It reads CONTROL_DIR/job.json (the program's argv, cwd, environment, log cap, run dir) and deletes it (the
environment, secrets included, never passes through Slurm: slurmctld stores a job's script and submit
environment), records what Slurm allocated (CONTROL_DIR/alloc.json: job id, node, GPUs, their names where
nvidia-smi answers), then runs the program under bridge/launcher.py (which writes CONTROL_DIR/launcher.json,
the exit status the runner reads) with stdout/stderr capped into RUN_DIR/logs. At SIGTERM (scancel, the time
limit) it closes the launcher's lifeline: the launcher ends the program's whole tree and still writes its
status.

Standard library only, run with `python -I` by path: bridge/logs.py is loaded from beside this file.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
# What Slurm tells the job about its allocation, passed on to the program.
ALLOCATION_VARS = ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS", "GPU_DEVICE_ORDINAL", "SLURM_JOB_ID")


def _logs_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("kakeya_logs", HERE / "logs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def main(argv: list[str]) -> int:
    control = Path(argv[1])
    spec_path = control / "job.json"
    spec = json.loads(spec_path.read_text())
    spec_path.unlink()
    env: dict[str, str] = dict(spec["env"])
    env.update({k: os.environ[k] for k in ALLOCATION_VARS if k in os.environ})
    alloc = {
        "job_id": os.environ.get("SLURM_JOB_ID"),
        "node": os.environ.get("SLURMD_NODENAME"),
        "partition": os.environ.get("SLURM_JOB_PARTITION"),
        "gpus": [g for g in os.environ.get("SLURM_JOB_GPUS", "").split(",") if g],
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "gpu_names": gpu_names(),
    }
    (control / "alloc.json").write_text(json.dumps(alloc))
    logs = _logs_module()
    lifeline_r, lifeline_w = os.pipe()
    stop = threading.Event()

    def on_signal(_signum: int, _frame: object) -> None:
        if not stop.is_set():
            stop.set()
            os.close(lifeline_w)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    launcher = [sys.executable, "-I", str(HERE / "launcher.py"), "--status", str(control / "launcher.json")]
    proc = subprocess.Popen(
        [*launcher, "--lifeline", str(lifeline_r), "--", *spec["argv"]],
        cwd=spec["cwd"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=(lifeline_r,),
    )
    os.close(lifeline_r)
    log_dir = Path(spec["run_dir"]) / "logs"
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
    while True:
        try:
            proc.wait()
            break
        except InterruptedError:  # pragma: no cover (PEP 475 retries)
            continue
    for t in pumps:
        t.join()
    if not stop.is_set():
        os.close(lifeline_w)
    if proc.returncode != 0:  # the launcher itself was killed: whatever status file is there is not its word
        status = control / "launcher.json"
        tmp = status.with_name(status.name + ".tmp")
        tmp.write_text(
            json.dumps({"exit_code": None, "lost": f"the launcher was killed ({proc.returncode})"})
        )
        tmp.replace(status)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
