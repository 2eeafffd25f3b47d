"""The Slurm executor (bridge/run/slurm.py) against a real single-node Slurm with 8 fake GPUs (slurm_support.py):
submit, GPUs as the preset's `resources` ask, the time limit to the second, cancels, a node failure, and
the hostile cases (a job name with Slurm's field separator, secrets in the environment, a program that
forges its exit status). Without root or Slurm's packages the cluster tests skip with the reason."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from bridge.bus.bus import Bus
from bridge.bus.records import CLAIM_PATH, Claim
from bridge.client.client import Client
from bridge.config import Config, SlurmLabel, load_config
from bridge.core.errors import InvalidRequest
from bridge.core.result import RunContext
from bridge.presets.preset import Preset
from bridge.presets.registry import load_registry
from bridge.results.outcome import RunOutcome
from bridge.run.execute import gate
from bridge.run.runner import Runner
from bridge.run.slurm import JobSpec, Slurm, SlurmExecutor, SlurmJob, SlurmRun, job_name, sbatch_argv
from bridge.run.slurm_runner import SlurmRunner
from bridge.wire import git as G
from tests.bridge.bus_support import (
    PRESETS,
    WRITE_REPORT_PY,
    Daemon,
    Env,
    done_result,
    git,
    processes_with,
    stop,
    wait_for,
)
from tests.bridge.slurm_support import GPU_TYPE, GPUS, PARTITION, Cluster, ClusterUnavailable
from tests.bridge.test_signing import allow, keygen

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = WRITE_REPORT_PY + textwrap.dedent("""
    import sys, time
    seconds = float(sys.argv[1])
    with open(os.path.join(os.environ["KAKEYA_RUN_DIR"], "seen.json"), "w") as fh:
        json.dump({"env": dict(os.environ), "started": time.time()}, fh)
    print("stdout line", flush=True)
    print(os.environ.get("HF_TOKEN", ""), file=sys.stderr, flush=True)
    sys.stdout.write("x" * int(os.environ.get("FLOOD", "0")))
    if os.environ.get("HOG") == "memory":
        hog = bytearray(1 << 30)
    elif os.environ.get("HOG") == "file":
        with open(os.path.join(os.environ["TMPDIR"], "big"), "wb") as fh:
            for _ in range(64):
                fh.write(b"x" * (1 << 20))
    elif os.environ.get("HOG") == "fork":
        for _ in range(64):
            try:
                if os.fork() == 0:
                    time.sleep(20)
                    os._exit(0)
            except BlockingIOError:
                print("forks refused", flush=True)
                sys.exit(3)
    time.sleep(seconds)
    write_report()
    sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
""")


@pytest.fixture(name="cluster", scope="session")
def cluster_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except ClusterUnavailable as exc:
        pytest.skip(f"no test Slurm: {exc}")
    yield cluster
    cluster.stop()


@pytest.fixture(name="slurm")
def slurm_fixture(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[Slurm]:
    """The cluster's clients, with every job of an earlier test cancelled and the node back up."""
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    if not cluster.alive("slurmd"):
        cluster.start_slurmd()
    cluster.run("scontrol", "update", f"nodename={'node1'}", "state=resume", check=False)
    yield Slurm()
    cluster.run("scancel", "-u", "root", check=False)


def make_preset(tmp: Path, **extra: object) -> Preset:
    (tmp / "prog.py").write_text(PROGRAM)
    data = {
        "name": "gpujob",
        "description": "a Slurm test program",
        "runners": ["h200"],
        "timeout_s": 60,
        "argv": ["{python}", "prog.py", "{seconds}", "{code}"],
        "params": {
            "seconds": {"type": "float", "min": 0, "max": 600, "default": 0},
            "code": {"type": "int", "min": 0, "max": 9, "default": 0},
        },
        "report": {"kind": "probe", "schema_version": 1},
        "resources": {"gpus": 1},
        **extra,
    }
    return Preset.model_validate(data)


LABEL = SlurmLabel(executor="slurm", partition=PARTITION, gpu_type=GPU_TYPE)
LIMITS_UID = 64125  # the limits test's run user: a bare uid no other test runs as


class Harness:
    def __init__(self, tmp: Path, slurm: Slurm, config: Config | None = None, label: SlurmLabel = LABEL):
        self.tmp = tmp
        self.config = config or Config(runner_name="slurm-test", labels=["h200"])
        self.ex = SlurmExecutor(label, self.config, slurm)
        self.presets: dict[str, Preset] = {}
        self.runs = tmp.with_name(tmp.name + "-runs")  # beside the subject, not in it
        tmp.chmod(0o755)  # as a runner's export is (pytest's are 0700: the sandbox's root could not enter)

    def start(
        self, rid: str, preset: Preset, environ: dict[str, str] | None = None, **values: object
    ) -> SlurmRun:
        params = preset.validate_params(values)
        setup = self.ex.setup(
            preset,
            params,
            self.tmp,  # the subject: the job copies it into the run's own sandbox/work
            self.runs / rid / "out",
            self.runs / rid / "control",
            RunContext(request_id=rid, runner_name="slurm-test", runner_labels=["h200"]),
            environ={"PATH": "/usr/bin:/bin", **(environ or {})},
        )
        self.presets[rid] = preset
        return self.ex.launch(setup)

    def wait(self, runs: list[SlurmRun], timeout: float = 60, until: str = "ended") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.ex.poll(runs)
            if all(self.ex.ended(r) if until == "ended" else r.job and r.job.state == until for r in runs):
                return
            time.sleep(0.2)
        raise AssertionError(f"not {until} in {timeout} s: {[r.describe() for r in runs]}")

    def finish(self, run: SlurmRun) -> RunOutcome:
        self.wait([run])
        return gate(self.ex.collect(run), self.presets[run.spec.request_id], self.config.report_cap_bytes)


# -- without a cluster ---------------------------------------------------------------------------------


def test_sbatch_argv_asks_for_what_the_preset_and_label_say(tmp_path: Path) -> None:
    label = SlurmLabel(
        executor="slurm",
        partition="gpu",
        account="ml",
        qos="high",
        gpu_type="h200",
        sbatch_options=["--constraint=ib"],
    )
    preset = make_preset(tmp_path, resources={"gpus": 2, "cpus": 8, "memory": "64G"}, timeout_s=90)
    spec = JobSpec("r1", tmp_path / "c", tmp_path / "o", tmp_path, ["x"], {}, 90, 1024, preset.resources)
    argv = sbatch_argv(spec, label)
    for want in (
        "--no-requeue",
        "--job-name=kakeya-r1",
        "--export=NONE",
        "--partition=gpu",
        "--account=ml",
        "--qos=high",
        "--gres=gpu:h200:2",
        "--cpus-per-task=8",
        "--mem=64G",
        "--time=4",  # the backstop: whole minutes above the preset's limit
        "--constraint=ib",
    ):
        assert want in argv
    assert argv[-1] == str(tmp_path / "c" / "job.sh")


def test_a_labels_gpus_are_asked_for_where_the_preset_names_none(tmp_path: Path) -> None:
    """The shipped presets declare no `resources` (their hash is what signed evidence names): an h200 Slurm
    label's `gpus` asks for the GPU; a preset's own `resources.gpus`, 0 included, wins."""
    label = SlurmLabel(executor="slurm", gpu_type="h200", gpus=1)

    def gres(resources: dict | None) -> list[str]:
        preset = make_preset(tmp_path, resources=resources)
        spec = JobSpec("r1", tmp_path / "c", tmp_path / "o", tmp_path, ["x"], {}, 60, 1024, preset.resources)
        return [a for a in sbatch_argv(spec, label) if a.startswith("--gres")]

    assert gres(None) == ["--gres=gpu:h200:1"]
    assert gres({"cpus": 4}) == ["--gres=gpu:h200:1"]
    assert gres({"gpus": 2}) == ["--gres=gpu:h200:2"]
    assert gres({"gpus": 0}) == []
    assert all("resources" not in yaml.safe_load(p.read_text()) for p in (ROOT / "presets").glob("*.yaml"))
    with pytest.raises(ValueError):
        SlurmLabel(executor="slurm", gpus=-1)


@pytest.mark.parametrize(
    "option",
    ["--export=ALL", "-Jother", "--job-name=x", "--requeue", "--time=9999", "--wrap=sh", "constraint"],
)
def test_a_label_cannot_override_what_kakeya_sets(option: str) -> None:
    with pytest.raises(ValueError, match="sbatch option"):
        SlurmLabel(executor="slurm", sbatch_options=[option])


def test_label_names_are_plain(tmp_path: Path) -> None:
    (tmp_path / "kakeya.toml").write_text('[executors.h200]\nexecutor = "slurm"\npartition = "gpu --uid=0"\n')
    from bridge.config import load_config

    with pytest.raises(InvalidRequest, match="partition"):
        load_config(tmp_path, environ={})
    (tmp_path / "kakeya.toml").write_text('[executors.h200]\nexecutor = "slurm"\npartition = "gpu"\n')
    config = load_config(tmp_path, environ={})
    assert config.executor_for("h200") == SlurmLabel(executor="slurm", partition="gpu")
    assert config.executor_for("cpu").executor == "local"


def test_resources_are_validated_like_other_preset_fields(tmp_path: Path) -> None:
    for bad in ({"gpus": -1}, {"memory": "64G; rm -rf /"}, {"cpus": 0}, {"gpu": 1}):
        with pytest.raises(ValueError):
            make_preset(tmp_path, resources=bad)
    # a preset without resources hashes as before resources existed
    plain = make_preset(tmp_path, resources=None)
    assert "resources" not in json.dumps(plain.model_dump(exclude_none=True))
    assert plain.content_hash != make_preset(tmp_path).content_hash


def test_a_job_name_with_the_field_separator_parses_whole() -> None:
    job = SlurmJob.parse("17|PENDING|Resources||gpu|2026-11-25T13:24:04|N/A|kakeya-a|b|c")
    assert job is not None
    assert (job.job_id, job.name, job.describe()) == ("17", "kakeya-a|b|c", "pending (Resources)")
    running = SlurmJob.parse("18|RUNNING|None|node1|gpu|2026-11-25T13:24:04|2026-11-25T13:24:06|kakeya-x")
    assert running is not None and running.describe() == "running on node1" and running.started is not None
    assert SlurmJob.parse("garbage") is None


# -- against the cluster -------------------------------------------------------------------------------


def test_gpus_match_resources_and_provenance_is_recorded(tmp_path: Path, slurm: Slurm) -> None:
    h = Harness(tmp_path, slurm)
    run = h.start("gpus-2", make_preset(tmp_path, resources={"gpus": 2, "cpus": 1}), seconds=0.5)
    outcome = h.finish(run)
    result = outcome.result
    assert result.status == "succeeded", result.reason
    seen = json.loads((run.out_dir / "seen.json").read_text())["env"]
    assert seen["CUDA_VISIBLE_DEVICES"] == "0,1"
    sched = result.scheduler
    assert sched is not None
    assert (sched.job_id, sched.node, sched.partition, sched.state) == (
        run.job_id,
        "node1",
        PARTITION,
        "COMPLETED",
    )
    assert len(sched.gpus) == 2 and sched.queue_wait_s is not None and sched.run_time_s is not None
    assert (run.out_dir / "logs" / "stdout.log").read_text() == "stdout line\n"
    assert job_name("gpus-2") in slurm.queue()


def test_the_environment_is_built_not_inherited_and_no_secret_reaches_slurm(
    tmp_path: Path, slurm: Slurm, cluster: Cluster
) -> None:
    h = Harness(tmp_path, slurm)
    preset = make_preset(tmp_path, env={"HF_TOKEN": "${ENV:HF_TOKEN}"}, secrets=["HF_TOKEN"])
    secret = "hf_s3cr3t_value_123456"
    run = h.start("env-1", preset, environ={"HF_TOKEN": secret, "RUNNER_ONLY": "leak"}, seconds=0.2)
    h.wait([run], until="RUNNING", timeout=30)
    for path in cluster.root.rglob("*"):  # slurmctld's state (script, environment), logs, spool
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    outcome = h.finish(run)
    env = json.loads((run.out_dir / "seen.json").read_text())["env"]
    assert env["HF_TOKEN"] == secret  # the program got it (and printed it) ...
    assert secret in (run.out_dir / "logs" / "stderr.log").read_text()
    assert "RUNNER_ONLY" not in env and "SLURM_CONF" not in env
    assert not (run.spec.control / "job.json").exists()  # ... the job file that held it is gone ...
    outcome.write()
    for path in run.out_dir.rglob("*"):  # ... and no file of the result holds it
        assert not path.is_file() or secret.encode() not in path.read_bytes(), path


def test_logs_are_capped_inside_the_job(tmp_path: Path, slurm: Slurm) -> None:
    h = Harness(tmp_path, slurm, Config(runner_name="slurm-test", labels=["h200"], log_cap_bytes=4096))
    run = h.start("flood-1", make_preset(tmp_path, env={"FLOOD": "1000000"}))
    outcome = h.finish(run)
    assert outcome.result.status == "succeeded", outcome.result.reason
    log = (run.out_dir / "logs" / "stdout.log").read_text()
    assert len(log) < 4096 + 200 and "kakeya cut" in log  # 1 MB written, the cap kept


@pytest.mark.parametrize(
    ("hog", "why"),
    [
        ("memory", "its memory limit of 64 MiB per process (limits.memory_mb)"),
        ("file", "its limit of 8 MiB per file, /tmp's too (limits.file_mb)"),
        ("fork", "its limit of 16 processes and threads (limits.processes)"),
    ],
)
def test_a_job_gets_the_presets_limits_and_an_over_limit_run_ends_in_error_naming_it(
    tmp_path: Path, slurm: Slurm, hog: str, why: str
) -> None:
    limits = {"memory_mb": 64, "file_mb": 8, "processes": 16}
    # a run user of its own: the kernel counts a user's processes host-wide, and other tests' runs (as nobody,
    # the default) would spend part of this one's budget where the launcher, in its PID namespace, sees none
    h = Harness(tmp_path, slurm, Config(runner_name="slurm-test", labels=["h200"], run_user=str(LIMITS_UID)))
    run = h.start(f"hog-{hog}", make_preset(tmp_path, env={"HOG": hog}, limits=limits))
    outcome = h.finish(run)
    iso = outcome.result.isolation or ""
    if hog == "fork" and not iso.startswith(("bwrap", "user")):  # the run is the job's user: not enforceable
        pytest.skip(f"isolation {iso}: no limit of processes")
    assert outcome.result.status == "error" and why in (outcome.result.reason or ""), outcome.result
    assert processes_with(str(run.spec.control)) == []


def test_a_nonzero_exit_is_the_programs_not_slurms(tmp_path: Path, slurm: Slurm) -> None:
    h = Harness(tmp_path, slurm)
    outcome = h.finish(h.start("exit-3", make_preset(tmp_path), code=3))
    assert (outcome.result.status, outcome.result.exit_code) == ("failed", 3)


def test_the_time_limit_counts_from_running_and_ends_within_seconds(tmp_path: Path, slurm: Slurm) -> None:
    h = Harness(tmp_path, slurm)
    run = h.start("late-1", make_preset(tmp_path, timeout_s=3), seconds=120)
    outcome = h.finish(run)
    result = outcome.result
    assert result.status == "timed-out", result.reason
    started = json.loads((run.out_dir / "seen.json").read_text())["started"]
    assert result.scheduler is not None and result.scheduler.run_time_s is not None
    assert 3 <= result.scheduler.run_time_s <= 6, result.scheduler
    assert time.time() - started < 20


def test_cancel_a_pending_and_a_running_job(tmp_path: Path, slurm: Slurm) -> None:
    h = Harness(tmp_path, slurm)
    preset = make_preset(tmp_path, resources={"gpus": GPUS})
    first = h.start("hog-1", preset, seconds=60)
    h.wait([first], until="RUNNING", timeout=30)
    second = h.start("hog-2", preset, seconds=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not second.describe().startswith("pending ("):
        h.ex.poll([second])
        time.sleep(0.2)
    assert second.job is not None and second.job.state == "PENDING"
    assert second.describe() in ("pending (Resources)", "pending (Priority)"), second.describe()
    for run in (second, first):
        h.ex.stop(run, "cancelled", "cancelled on the bus")
    outcomes = [h.finish(r) for r in (first, second)]
    assert [o.result.status for o in outcomes] == ["cancelled", "cancelled"]
    assert not (second.out_dir / "seen.json").exists()  # the pending one never ran


def test_an_admin_scancel_ends_in_an_error_naming_it(tmp_path: Path, slurm: Slurm, cluster: Cluster) -> None:
    h = Harness(tmp_path, slurm)
    run = h.start("admin-1", make_preset(tmp_path), seconds=60)
    h.wait([run], until="RUNNING", timeout=30)
    cluster.run("scancel", run.job_id)
    outcome = h.finish(run)
    # the launcher wrote that the program died of SIGTERM; Slurm says who sent it
    assert outcome.result.status == "error", outcome.result
    assert "CANCELLED" in (outcome.result.reason or "") and "outside Kakeya" in (outcome.result.reason or "")


FORGER = WRITE_REPORT_PY + textwrap.dedent("""
    import json, os, signal
    write_report()
    # the launcher's status is written in the sandbox's top (HOME's parent): forge it, then kill the launcher
    with open(os.path.join(os.environ["HOME"], "..", "launcher.json"), "w") as fh:
        json.dump({"exit_code": 0, "strays": 0, "start_error": None}, fh)
    os.kill(os.getppid(), signal.SIGKILL)
""")


@pytest.mark.parametrize("isolation", ["none", "auto"])
def test_a_program_that_forges_its_status_and_kills_the_launcher_does_not_succeed(
    tmp_path: Path, slurm: Slurm, isolation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = Config(runner_name="slurm-test", labels=["h200"], isolation=isolation)  # type: ignore[arg-type]
    h = Harness(tmp_path, slurm, config)
    (tmp_path / "forger.py").write_text(FORGER)
    preset = make_preset(tmp_path, argv=["{python}", "forger.py"], params={})
    if isolation == "none" and os.geteuid() == 0:  # a root job runs no program as root: refused on the node
        result = h.finish(h.start("forge-0", preset)).result
        assert result.status == "error" and "node1 runs the job as root, and as root, isolation none" in (
            result.reason or ""
        ), result
        assert (
            result.exit_code is None
            and not (tmp_path.with_name(tmp_path.name + "-runs") / "forge-0" / "out" / "report.json").exists()
        )
        monkeypatch.setenv("KAKEYA_TEST_ROOT_RUNS", "1")  # the suite's trusted programs may: the forgery next
    run = h.start("forge-1", preset)
    outcome = h.finish(run)
    result = outcome.result
    if result.isolation and result.isolation.startswith("bwrap"):
        # the run user may not write beside its own directories: the forgery never got written
        assert result.status == "failed", result
        assert "Permission denied" in (run.out_dir / "logs" / "stderr.log").read_text()
    else:
        assert result.isolation == "none (a Slurm job)", result.isolation
        assert result.status == "error", result
        assert "launcher was killed" in (result.reason or "")


SNOOP = WRITE_REPORT_PY + textwrap.dedent("""
    import json, os, subprocess, sys
    seen = {}
    for name, path in json.loads(sys.argv[1]).items():
        try:
            seen[name] = sorted(os.listdir(path)) if os.path.isdir(path) else open(path).read()
        except OSError as exc:
            seen[name] = type(exc).__name__
    seen["job_env"] = {k: v for k, v in os.environ.items() if k.startswith("SLURM")}
    # a daemon in a session of its own, left behind: it must die with the job
    subprocess.Popen(["setsid", sys.executable, "-c", "import time; time.sleep(300)", sys.argv[2]],
                     start_new_session=True, stdin=subprocess.DEVNULL)
    with open(os.path.join(os.environ["KAKEYA_RUN_DIR"], "snoop.json"), "w") as fh:
        json.dump(seen, fh)
    write_report()
""")


def test_the_program_runs_in_the_nodes_sandbox_and_nothing_it_leaves_outlives_the_job(
    tmp_path: Path, slurm: Slurm
) -> None:
    """Where the node has bubblewrap, the job's program runs in the sandbox a local run gets: it cannot read the
    runner's state directory or key, nor the job's own files (alloc.json, the env file job.json); a setsid'd
    daemon it leaves dies with the job; result.json says `bwrap (...) (a Slurm job)`."""
    from bridge.run.isolation import bwrap_available

    if not bwrap_available():
        pytest.skip("bubblewrap cannot make a sandbox here (the job then runs under isolation none)")
    state = tmp_path.with_name(tmp_path.name + "-state")  # the runner's state directory, and its key
    state.mkdir()
    (state / "signing.key").write_text("PRIVATE KEY")
    (state / "signing.key").chmod(0o644)  # readable by anyone: only the sandbox keeps it out of reach
    h = Harness(tmp_path, slurm, Config(runner_name="slurm-test", labels=["h200"], isolation="auto"))
    control = h.runs / "snoop-1" / "control"
    targets = {
        "state": str(state),
        "key": str(state / "signing.key"),
        "control": str(control),
        "alloc": str(control / "alloc.json"),
        "job_env_file": str(control / "job.json"),
        "runs": str(h.runs),
    }
    (tmp_path / "snoop.py").write_text(SNOOP)
    token = f"kakeya-daemon-{time.time_ns()}"
    preset = make_preset(
        tmp_path,
        argv=["{python}", "snoop.py", json.dumps(targets), token],
        params={},
        env={"HF_TOKEN": "${ENV:HF_TOKEN}"},
        secrets=["HF_TOKEN"],
    )
    run = h.start("snoop-1", preset, environ={"HF_TOKEN": "hf_job_env_secret_0042"})
    outcome = h.finish(run)
    result = outcome.result
    assert result.status == "succeeded", result.reason
    assert (result.isolation or "").startswith("bwrap (") and result.isolation.endswith(" (a Slurm job)")
    seen = json.loads((run.out_dir / "snoop.json").read_text())
    assert seen["state"] == "FileNotFoundError" and seen["key"] == "FileNotFoundError", seen
    assert seen["alloc"] == "FileNotFoundError" and seen["job_env_file"] == "FileNotFoundError", seen
    assert seen["control"] == ["sandbox"], seen  # of the job's control directory, only its own part
    assert seen["runs"] == ["snoop-1"], seen
    assert (control / "alloc.json").is_file()  # it was there all along, outside the sandbox
    assert result.strays_killed and result.strays_killed >= 1  # the daemon, ended by the launcher
    assert processes_with(token) == []  # and nothing of it is left on the node


def test_a_shipped_accelerator_preset_gets_its_gpu_on_an_h200_slurm_label(
    tmp_path: Path, slurm: Slurm
) -> None:
    """The shipped `probe` (no `resources`) on an h200 Slurm label whose `gpus` is 1: the job is allocated
    one GPU and the program sees it in CUDA_VISIBLE_DEVICES (before: no --gres, no GPU, a failed device
    check on every h200 run)."""
    preset = load_registry(ROOT / "presets")["probe"]
    assert preset.resources is None and "h200" in preset.runners
    shutil.copytree(ROOT / "engine", tmp_path / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    h = Harness(tmp_path, slurm, label=LABEL.model_copy(update={"gpus": 1}))
    run = h.start("probe-1", preset)
    h.wait([run], timeout=180)
    outcome = gate(h.ex.collect(run), preset, h.config.report_cap_bytes)
    assert outcome.result.status == "succeeded", outcome.result.reason
    alloc = json.loads((h.runs / "probe-1" / "control" / "alloc.json").read_text())
    assert alloc["cuda_visible_devices"] == "0", alloc  # what the job passed on to the program
    sched = outcome.result.scheduler
    assert sched is not None and len(sched.gpus) == 1, sched
    report = json.loads((run.out_dir / "report.json").read_text())
    assert report["probe"]["cpu_count"] >= 1  # the shipped program itself ran, on the node


SNITCH = WRITE_REPORT_PY + textwrap.dedent("""
    import sys
    open(sys.argv[1], "w").write("the program ran")
    write_report()
""")


@pytest.mark.parametrize("node_gives", ["none", "userns"])
def test_a_signing_label_refuses_to_run_where_the_node_gives_no_sandbox(
    tmp_path: Path, slurm: Slurm, node_gives: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node without a sandbox (simulated: the isolation the node chooses is `none`, or `userns`, the
    runner's own user either way): with the runner's signing key the job's wrapper refuses before the
    program starts; the run ends in `error` saying why."""
    from bridge.run.isolation import userns_available

    if node_gives == "userns" and not userns_available():
        pytest.skip("no user namespaces here")
    key = tmp_path.with_name(tmp_path.name + "-state") / "signing-key"
    key.parent.mkdir()
    key.write_text("PRIVATE KEY")
    key.chmod(0o600)
    ran = tmp_path.with_name(tmp_path.name + "-ran")
    config = Config(runner_name="slurm-test", labels=["h200"], isolation=node_gives, signing_key=str(key))  # type: ignore[arg-type]
    h = Harness(tmp_path, slurm, config)
    (tmp_path / "snitch.py").write_text(SNITCH)
    run = h.start("unsafe-1", make_preset(tmp_path, argv=["{python}", "snitch.py", str(ran)], params={}))
    result = h.finish(run).result
    assert result.status == "error", result
    assert not ran.exists()  # the program never started
    assert result.isolation == f"{node_gives} (a Slurm job)", result.isolation
    reason = result.reason or ""
    assert f"refused to run the program: node1 gave it isolation {node_gives}" in reason, reason
    assert "this runner signs its results" in reason and str(key) in reason, reason
    assert "install bubblewrap on the compute nodes" in reason, reason
    # the same label without a key runs it: as another user than root (the suite's root says so by its variable)
    h2 = Harness(tmp_path, slurm, Config(runner_name="slurm-test", labels=["h200"], isolation=node_gives))  # type: ignore[arg-type]
    preset = make_preset(tmp_path, argv=["{python}", "snitch.py", str(ran)], params={})
    if os.geteuid() == 0:
        result = h2.finish(h2.start("unsafe-root", preset)).result
        assert result.status == "error" and f"runs the job as root, and as root, isolation {node_gives}" in (
            result.reason or ""
        ), result
        assert not ran.exists()
        monkeypatch.setenv("KAKEYA_TEST_ROOT_RUNS", "1")
    run = h2.start("unsafe-2", preset)
    assert h2.finish(run).result.status == "succeeded"
    assert ran.read_text() == "the program ran"


# -- a Slurm runner over a real bus --------------------------------------------------------------------


@pytest.fixture(name="bus")
def bus_fixture(world: Env, daemon: Daemon, slurm: Slurm) -> str:
    """A bus with the `gpuwork` preset (work.py on label h200, one GPU)."""
    gpuwork = {"name": "gpuwork", **PRESETS["work"], "runners": ["h200"], "resources": {"gpus": 1}}
    (world.presets / "gpuwork.yaml").write_text(yaml.safe_dump(gpuwork))
    return daemon.repo()


def slurm_runner(world: Env, url: str, name: str = "slurm-1", max_in_flight: int = 10) -> SlurmRunner:
    """A runner whose label h200 is a Slurm label (no GPU here: the hardware is the cluster's)."""
    label = LABEL.model_copy(update={"max_in_flight": max_in_flight})
    config = load_config().model_copy(update={"executors": {"h200": label}})
    runner = Runner(url, config=config, name=name, labels=["h200"], workdir=world.tmp / "runners" / name)
    return SlurmRunner(runner, "h200", SlurmExecutor(label, config, Slurm()), world.tmp / "jobs")


def request(url: str, tag: str, seconds: float = 0, mode: str = "sleep") -> str:
    client = Client(load_config(), remote=url)
    return client.request("gpuwork", {"tag": tag, "mode": mode, "seconds": seconds}, "h200").id


def serve_until(sr: SlurmRunner, cond: Callable[[], object], timeout: float, what: str) -> None:
    def once() -> object:
        sr.step()
        return cond()

    wait_for(once, timeout, what, step=0.3)


def results(world: Env, url: str, ids: list[str]) -> dict[str, dict]:
    store = world.tmp / "store.git"
    G.init_bare(store)
    return {rid: done_result(store, url, rid) for rid in ids}


def test_ten_one_gpu_requests_on_eight_gpus_run_eight_at_once_exactly_once(
    world: Env, bus: str, slurm: Slurm
) -> None:
    ids = [request(bus, f"t{i}", seconds=6) for i in range(10)]
    sr = slurm_runner(world, bus)
    most = [0]
    pending_seen = set()

    def all_done() -> bool:
        jobs = [j for j in slurm.queue().values() if j.name.removeprefix("kakeya-") in ids]
        running = sum(1 for j in jobs if j.running)
        most[0] = max(most[0], running)
        pending_seen.update(j.describe() for j in jobs if j.state == "PENDING")
        return len(sr.done) == 10

    try:
        serve_until(sr, all_done, 120, "10 Slurm runs")
    finally:
        sr.close()
    assert most[0] == GPUS, most  # 8 at once, never more
    assert any(p.startswith("pending (") for p in pending_seen), pending_seen
    assert sorted(world.count()) == sorted(f"t{i}" for i in range(10))  # each ran exactly once
    done = results(world, bus, ids)
    assert {r["status"] for r in done.values()} == {"succeeded"}
    assert len({r["scheduler"]["job_id"] for r in done.values()}) == 10
    assert all(r["scheduler"]["gpus"] and r["scheduler"]["node"] == "node1" for r in done.values())


def test_heartbeats_carry_the_slurm_state_and_a_bus_cancel_scancels(
    world: Env, bus: str, slurm: Slurm
) -> None:
    hog = {"name": "hog", **PRESETS["work"], "runners": ["h200"], "resources": {"gpus": GPUS}}
    (world.presets / "hog.yaml").write_text(yaml.safe_dump(hog))
    client = Client(load_config(), remote=bus)
    running = client.request("hog", {"tag": "run", "mode": "sleep", "seconds": 120}, "h200").id
    sr = slurm_runner(world, bus)
    try:
        serve_until(sr, lambda: world.mark("run", "started").exists(), 60, "the first job to start")
        pending = client.request("hog", {"tag": "pend", "mode": "sleep", "seconds": 120}, "h200").id

        def states() -> dict[str, str | None]:
            out = {}
            for rid in (running, pending):
                entry = client.entry(rid)
                client.ensure([entry], ("claim",), in_store=True)
                path = f"{entry.claim}:{CLAIM_PATH}"
                claim = Claim.model_validate_json(client.local_files([path])[path] or b"")
                p = claim.progress
                out[rid] = f"{p.phase} ({p.scheduler})" if p else None
            return out

        serve_until(
            sr,
            lambda: (
                (s := states())[running] == "running (running on node1)"
                and (s[pending] or "").startswith(
                    "queued (pending ("
                )  # waiting in Slurm's queue: not running
            ),
            30,
            "heartbeats with Slurm states",
        )
        # what a person sees: `kakeya wait` and `kakeya runners` say the pending job is queued
        cli = [sys.executable, "-m", "bridge.cli"]
        waited = subprocess.run(
            [*cli, "wait", pending, "--remote", bus, "--timeout", "3"],
            cwd=world.project,
            capture_output=True,
            text=True,
        ).stdout
        assert "queued (pending (" in waited and "running (pending" not in waited, waited
        sr.runner.start_presence()

        def runners() -> str:
            argv = [*cli, "runners", "--remote", bus]
            out = subprocess.run(argv, cwd=world.project, capture_output=True, text=True).stdout
            return out if f"{pending} queued (pending (" in out else ""

        serve_until(sr, runners, 30, "`kakeya runners` to show the pending job queued")
        assert f"{running} running (running on node1)" in runners()
        for rid in (pending, running):
            client.cancel(rid, "test")
        serve_until(sr, lambda: len(sr.done) == 2, 60, "both cancelled")
    finally:
        sr.close()
        sr.runner.stop_presence()
    done = results(world, bus, [running, pending])
    assert done[running]["status"] == "cancelled" and done[pending]["status"] == "cancelled"
    assert not world.mark("pend", "started").exists()
    assert world.count() == []
    assert not [j for j in slurm.queue().values() if not j.ended]


def test_a_runner_holds_no_more_than_max_in_flight_jobs(world: Env, bus: str, slurm: Slurm) -> None:
    ids = [request(bus, f"m{i}", seconds=2) for i in range(4)]
    sr = slurm_runner(world, bus, max_in_flight=2)
    most = [0]

    def done() -> bool:
        live = [j for j in slurm.queue().values() if j.name.removeprefix("kakeya-") in ids and not j.ended]
        most[0] = max(most[0], len(live), len(sr.flights))
        return len(sr.done) == 4

    try:
        serve_until(sr, done, 90, "4 requests, 2 at a time")
    finally:
        sr.close()
    assert most[0] == 2
    assert sorted(world.count()) == ["m0", "m1", "m2", "m3"]


def test_a_restarted_runner_adopts_its_jobs_and_a_takeover_runs_nothing_twice(
    world: Env, bus: str, slurm: Slurm
) -> None:
    ids = [request(bus, f"a{i}", seconds=8, mode="once") for i in range(3)]
    first = slurm_runner(world, bus, "slurm-1")
    try:
        serve_until(
            first, lambda: all(world.mark(f"a{i}", "first").exists() for i in range(3)), 60, "3 jobs running"
        )
    finally:
        first.close()  # the runner dies: its leases stop beating, its jobs go on
    jobs = {j.name: j.job_id for j in slurm.queue().values()}
    # the same runner restarted, and a second one: whoever takes a claim over adopts the job by its name
    again, other = slurm_runner(world, bus, "slurm-1"), slurm_runner(world, bus, "slurm-2")
    try:
        serve_until(
            again,
            lambda: (other.step(), len(again.done) + len(other.done) == 3)[1],
            90,
            "the adopted jobs to end",
        )
    finally:
        again.close()
        other.close()
    done = results(world, bus, ids)
    assert {r["status"] for r in done.values()} == {"succeeded"}
    assert sorted(world.count()) == ["a0", "a1", "a2"]  # each program ran once
    assert {r["scheduler"]["job_id"] for r in done.values()} == {jobs[f"kakeya-{rid}"] for rid in ids}
    assert len([j for j in slurm.queue().values() if j.name.removeprefix("kakeya-") in ids]) == 3


def test_a_node_failure_under_a_runner_ends_in_an_error_done_commit(
    world: Env, bus: str, slurm: Slurm, cluster: Cluster
) -> None:
    rid = request(bus, "nf", seconds=110)
    sr = slurm_runner(world, bus)
    try:
        serve_until(sr, lambda: world.mark("nf", "started").exists(), 60, "the job to start")
        cluster.kill_slurmd()
        serve_until(sr, lambda: sr.done, 120, "the node failure to end the request")
    finally:
        sr.close()
        cluster.kill_job_processes()
        cluster.start_slurmd()
    result = results(world, bus, [rid])[rid]
    assert result["status"] == "error" and "NODE_FAIL" in result["reason"] and "node1" in result["reason"]


def test_a_runner_process_killed_mid_run_is_restarted_and_adopts_its_job(
    world: Env, bus: str, slurm: Slurm, cluster: Cluster
) -> None:
    """`kakeya runner watch` on a Slurm label (kakeya.toml's executors), SIGKILLed while its job runs; the
    restarted process adopts the job by its name; the program ran once; `kakeya runners` showed its state."""
    (world.project / "kakeya.toml").write_text(
        f'[executors.h200]\nexecutor = "slurm"\npartition = "{PARTITION}"\ngpu_type = "{GPU_TYPE}"\n'
    )
    git(world.project, "add", "kakeya.toml")
    git(world.project, "commit", "-q", "-m", "slurm label")
    rid = request(bus, "k1", seconds=8, mode="once")

    def start() -> subprocess.Popen[bytes]:
        log = (world.tmp / "slurm-runner.log").open("ab")
        argv = [sys.executable, "-m", "bridge.cli", "runner", "watch", "--labels", "h200", "--name", "s1"]
        return subprocess.Popen(
            [*argv, "--remote", bus], cwd=world.project, stdout=log, stderr=subprocess.STDOUT
        )

    waiter = subprocess.Popen(
        [sys.executable, "-m", "bridge.cli", "wait", rid, "--remote", bus],
        cwd=world.project,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    first = start()
    try:
        wait_for(lambda: world.mark("k1", "first").exists(), 60, "the job to start")
        job_id = slurm.queue()[job_name(rid)].job_id
        # the job's files are in the state directory (shared with the nodes), where any runner finds them
        assert (world.project / ".kakeya" / "slurm-jobs" / rid / "control" / "alloc.json").is_file()

        def runners() -> str:
            argv = [sys.executable, "-m", "bridge.cli", "runners", "--remote", bus]
            out = subprocess.run(argv, cwd=world.project, capture_output=True, text=True).stdout
            return out if f"{rid} running (running on node1)" in out else ""

        wait_for(runners, 30, "`kakeya runners` to show the job running on node1", step=0.5)
    finally:
        stop(first, signal.SIGKILL)
    assert not slurm.queue()[job_name(rid)].ended  # the job goes on without its runner
    second = start()
    try:
        wait_for(lambda: Bus(bus, world.project).ls_remote().entries[rid].done, 90, "the adopted job's end")
    finally:
        stop(second)
    waited, _ = waiter.communicate(timeout=60)
    assert "(running on node1)" in waited, waited  # `kakeya wait` showed the job's Slurm state
    result = results(world, bus, [rid])[rid]
    assert result["status"] == "succeeded" and result["scheduler"]["job_id"] == job_id
    assert world.count() == ["k1"]
    assert "adopts Slurm job" in (world.tmp / "slurm-runner.log").read_text()


def test_over_the_bus_a_job_past_its_time_limit_ends_timed_out_within_seconds(
    world: Env, bus: str, slurm: Slurm
) -> None:
    quick = {
        "name": "quick",
        **PRESETS["work"],
        "runners": ["h200"],
        "timeout_s": 4,
        "resources": {"gpus": 1},
    }
    (world.presets / "quick.yaml").write_text(yaml.safe_dump(quick))
    rid = (
        Client(load_config(), remote=bus)
        .request("quick", {"tag": "tl", "mode": "sleep", "seconds": 100}, "h200")
        .id
    )
    sr = slurm_runner(world, bus)
    try:
        serve_until(sr, lambda: sr.done, 60, "the time limit")
    finally:
        sr.close()
    result = results(world, bus, [rid])[rid]
    assert result["status"] == "timed-out", result
    assert 4 <= result["scheduler"]["run_time_s"] <= 8, result["scheduler"]  # the limit, to the second or so
    assert world.count() == []  # the program never finished


def test_a_job_slurm_forgot_is_collected_from_its_status_not_run_again(
    world: Env, bus: str, slurm: Slurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner died after its job ended and before its done commit; by the time another runner takes the
    claim, Slurm has forgotten the job (MinJobAge): the job's status file is the result, nothing reruns."""
    rid = request(bus, "f1", seconds=0, mode="once")
    first = slurm_runner(world, bus, "slurm-1")
    control = world.tmp / "jobs" / rid / "control"
    try:
        serve_until(
            first, lambda: rid in first.flights and first.flights[rid].run, 30, "the job's submission"
        )
        wait_for(lambda: (control / "launcher.json").is_file(), 60, "the job to end")
    finally:
        first.close()  # dies before it saw the end
    job_id = json.loads((control / "alloc.json").read_text())["job_id"]
    second = slurm_runner(world, bus, "slurm-2")
    monkeypatch.setattr(second.ex.slurm, "queue", lambda: {})  # Slurm no longer lists it
    try:
        serve_until(second, lambda: second.done, 60, "the takeover to collect the result")
    finally:
        second.close()
    result = results(world, bus, [rid])[rid]
    assert result["status"] == "succeeded" and result["scheduler"]["job_id"] == job_id
    assert world.count() == ["f1"]


def test_doctor_checks_a_slurm_label_through_slurm_not_local_cuda(
    world: Env, slurm: Slurm, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from bridge.cli.main import main

    monkeypatch.setenv("KAKEYA_LABELS", "h200")
    monkeypatch.setattr("bridge.cli.commands.doctor.check_engine", lambda: "not checked here")

    def doctor(**label: str) -> str:
        lines = "".join(f'{k} = "{v}"\n' for k, v in label.items())
        (world.project / "kakeya.toml").write_text(f'[executors.h200]\nexecutor = "slurm"\n{lines}')
        main(["doctor"])
        out = capsys.readouterr().out
        return next(line for line in out.splitlines() if line[6:].startswith("h200 "))

    line = doctor(partition=PARTITION, gpu_type=GPU_TYPE)
    assert line.startswith("ok    h200     Slurm label: partition gpu (up, 1 node(s), gpu:h200:8)"), line
    assert "CUDA" not in line  # this host has no GPU; the label's GPUs are the cluster's
    assert "asks for none (the label's `gpus` is 0: set `gpus = 1` for a GPU partition" in line, line
    line = doctor(partition=PARTITION, gpu_type=GPU_TYPE, gpus="1")
    assert line.endswith("a run whose preset names no GPUs (`resources`) asks for 1 (the label's `gpus`)"), (
        line
    )
    line = doctor(partition="nopart")
    assert line == "FAIL  h200     partition 'nopart' does not exist (`sinfo -h -p nopart` lists none)", line
    line = doctor(partition=PARTITION, gpu_type="a100")  # no such GPU in the partition: sbatch says so
    assert line.startswith("FAIL  h200     sbatch --test-only failed: "), line
    monkeypatch.setattr("bridge.cli.commands.doctor.check_git", lambda: "not checked here")
    with monkeypatch.context() as m:
        m.setenv("PATH", str(world.tmp))  # a login node without Slurm's clients
        line = doctor(partition=PARTITION)
    assert line == "FAIL  h200     squeue is not installed here (Slurm's client commands are needed)", line


def slurm_label_in_project(world: Env) -> None:
    """The project's kakeya.toml maps label h200 to the test cluster (what `kakeya runner` processes read)."""
    (world.project / "kakeya.toml").write_text(
        f'[executors.h200]\nexecutor = "slurm"\npartition = "{PARTITION}"\ngpu_type = "{GPU_TYPE}"\n'
    )
    git(world.project, "add", "kakeya.toml")
    git(world.project, "commit", "-q", "-m", "slurm label")


def test_runner_once_on_a_slurm_label_serves_one_request_through_slurm(
    world: Env, bus: str, slurm: Slurm
) -> None:
    slurm_label_in_project(world)
    first, second = request(bus, "o1", seconds=1), request(bus, "o2", seconds=1)
    argv = [sys.executable, "-m", "bridge.cli", "runner", "once", "--labels", "h200", "--remote", bus]
    proc = subprocess.run(argv, cwd=world.project, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    served = proc.stdout.split(":")[0]
    assert served in (first, second) and ": succeeded, verdict pass" in proc.stdout, proc.stdout
    assert "submitted Slurm job" in proc.stderr, proc.stderr
    result = results(world, bus, [served])[served]
    assert result["status"] == "succeeded" and result["scheduler"]["node"] == "node1"
    assert job_name(served) in slurm.queue()  # it was Slurm's job
    assert len(world.count()) == 1  # one request, not both
    other = second if served == first else first
    assert not Bus(bus, world.project).ls_remote().entries[other].claim  # the other one untouched
    # asked for by id: that one
    proc = subprocess.run([*argv, "--request", other], cwd=world.project, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith(f"{other}: "), proc.stdout + proc.stderr
    assert sorted(world.count()) == ["o1", "o2"]


def test_runner_watch_drains_at_a_first_sigterm_and_scancels_at_a_second(
    world: Env, bus: str, slurm: Slurm
) -> None:
    slurm_label_in_project(world)
    ids = [request(bus, f"s{i}", seconds=110) for i in range(2)]
    argv = [sys.executable, "-m", "bridge.cli", "runner", "watch", "--labels", "h200", "--name", "s1"]
    log = (world.tmp / "watch.log").open("wb")
    proc = subprocess.Popen([*argv, "--remote", bus], cwd=world.project, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(
            lambda: all(world.mark(f"s{i}", "started").exists() for i in range(2)), 60, "both jobs to run"
        )
        late = request(bus, "late", seconds=0)
        proc.send_signal(signal.SIGTERM)  # the first: no new request; the jobs in flight are followed
        time.sleep(3)
        assert proc.poll() is None, (world.tmp / "watch.log").read_text()
        live = {j.name for j in slurm.queue().values() if j.running}
        assert {job_name(r) for r in ids} <= live  # still running in Slurm
        proc.send_signal(signal.SIGTERM)  # the second: scancel them; each ends in a done commit
        assert proc.wait(60) == 0
    finally:
        stop(proc, signal.SIGKILL)
        log.close()
    done = results(world, bus, ids)
    for rid in ids:
        assert done[rid]["status"] == "error", done[rid]
        assert "stopped by SIGTERM" in done[rid]["reason"], done[rid]["reason"]
        assert slurm.queue()[job_name(rid)].state == "CANCELLED"
    assert world.count() == []  # neither program finished
    assert not Bus(bus, world.project).ls_remote().entries[late].claim  # nothing new was claimed


PLANT = WRITE_REPORT_PY + textwrap.dedent("""
    with open(os.path.join(os.environ["KAKEYA_RUN_DIR"], "attestation.json"), "w") as fh:
        fh.write('{"planted": true}')
    write_report()
""")


def test_a_signing_slurm_runner_attests_its_results_and_replaces_a_planted_attestation(
    world: Env, bus: str, slurm: Slurm, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Slurm runner delivers as the local runner does (bridge/run/deliver.py): its done commit carries the
    runner's attestation.json, which `kakeya verify` accepts, never the one the program left; where a node
    gives no sandbox the same runner's job starts nothing and its done commit is an `error` saying why."""
    from bridge.bus.trust import principal
    from bridge.cli.main import main
    from bridge.run.isolation import bwrap_available

    if not bwrap_available():
        pytest.skip("a signing runner needs a sandbox: bubblewrap is not usable here")
    (world.project / "plant.py").write_text(PLANT)
    git(world.project, "add", "plant.py")
    git(world.project, "commit", "-q", "-m", "plant")
    planter = {"name": "planter", **PRESETS["work"], "runners": ["h200"], "argv": ["{python}", "plant.py"]}
    planter.pop("params")
    planter.pop("verdict_free", None)
    (world.presets / "planter.yaml").write_text(yaml.safe_dump(planter))
    (world.tmp / "keys").mkdir()
    key = keygen(world.tmp / "keys" / "slurm-1")
    signers = allow(world.tmp / "allowed", (principal("slurm-1", ["h200"]), key))
    label = LABEL.model_copy(update={"gpus": 1})
    config = load_config().model_copy(
        update={"executors": {"h200": label}, "signing_key": str(key), "isolation": "bwrap"}
    )
    runner = Runner(bus, config=config, name="slurm-1", labels=["h200"], workdir=world.tmp / "runners" / "s1")
    sr = SlurmRunner(runner, "h200", SlurmExecutor(label, config, Slurm()), world.tmp / "jobs")
    rid = Client(load_config(), remote=bus).request("planter", {}, "h200").id
    served = sr.once(rid, poll_s=0.3)
    assert served is not None and served.status == "succeeded" and served.pushed, served
    out = world.tmp / "fetched"
    assert main(["results", rid, "--remote", bus, "--out", str(out)]) == 0
    attestation = out / rid / "attestation.json"
    assert "planted" not in attestation.read_text()
    # its provenance names the signer, as a local run's does (both start from `Runner.context`)
    assert json.loads((out / rid / "result.json").read_text())["signed_by"] == "slurm-1@h200"
    capsys.readouterr()
    assert main(["verify", str(attestation), "--allowed-signers", str(signers)]) == 0, capsys.readouterr().err
    said = capsys.readouterr().out
    assert "verified: signed by slurm-1@h200" in said and "files match their digests" in said, said
    # the same signing runner where the node gives no sandbox (simulated: the node's choice is `none`): the
    # job refuses before the program starts, and the error done commit says why
    node_none = config.model_copy(update={"isolation": "none"})
    sr = SlurmRunner(runner, "h200", SlurmExecutor(label, node_none, Slurm()), world.tmp / "jobs")
    rid = Client(load_config(), remote=bus).request("planter", {}, "h200").id
    served = sr.once(rid, poll_s=0.3)
    assert served is not None and served.status == "error" and served.pushed, served
    result = results(world, bus, [rid])[rid]
    assert result["isolation"] == "none (a Slurm job)" and result["exit_code"] is None, result
    assert "refused to run the program: node1 gave it isolation none" in result["reason"], result["reason"]
