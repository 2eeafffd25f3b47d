"""scripts/setup-runner.sh for real, in a temporary HOME: the Linux path with the project's venv reused
(--skip-install: nothing is installed, nothing is downloaded) and the service step dry-run."""

from __future__ import annotations

import os
import plistlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "setup-runner.sh"
VENV = Path(sys.prefix)  # the venv running these tests holds kakeya, installed from ROOT


def snapshot(home: Path) -> dict[str, tuple[str, int]]:
    """Every file and directory under home: relative path -> (content, mode)."""
    out = {}
    for path in sorted(home.rglob("*")):
        rel = path.relative_to(home).as_posix()
        out[rel] = (path.read_text() if path.is_file() else "<dir>", path.stat().st_mode & 0o777)
    return out


def setup(
    home: Path, *args: str, path: str | None = None, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    environ = {"HOME": str(home), "PATH": path or os.environ["PATH"], "LANG": "C.UTF-8"}
    environ.update(env or {})
    proc = subprocess.run(
        ["bash", str(SCRIPT), *args], env=environ, capture_output=True, text=True, timeout=120
    )
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    return home


@pytest.fixture
def bus(tmp_path: Path) -> Path:
    path = tmp_path / "bus.git"
    subprocess.run(["git", "init", "-q", "--bare", str(path)], check=True)
    return path


@pytest.fixture
def no_gpu_path(tmp_path: Path) -> str:
    """PATH whose nvidia-smi finds no GPU, so the CPU/GPU decision does not depend on the test machine."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the driver.'\nexit 9\n"
    )
    fake.chmod(0o755)
    # as root the script makes the run user: a stand-in records it, so no test adds a user to this host
    (bindir / "useradd").write_text(f'#!/bin/sh\necho "useradd $*" >> "{bindir}/useradd.calls"\n')
    (bindir / "useradd").chmod(0o755)
    for tool in ("apt-get", "dnf"):  # and installs bubblewrap where it is missing: recorded, never done
        (bindir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "{bindir}/install.calls"\n')
        (bindir / tool).chmod(0o755)
    return f"{bindir}:{os.environ['PATH']}"


def service_args(
    bus: Path, *extra: str, os: str = "linux", labels: str = "cpu,h200", name: str = "box-1"
) -> list[str]:
    """setup-runner.sh's flags for a runner service on `os` (written, not started: --dry-run-service)."""
    common = ["--venv", str(VENV), "--skip-install", "--labels", labels, "--name", name, "--remote", str(bus)]
    return ["--os", os, *common, "--dry-run-service", *extra]


def test_linux_service_unit_runs_the_watcher_with_the_hosts_labels(home, bus, no_gpu_path):
    proc = setup(
        home, *service_args(bus), path=no_gpu_path, env={"KAKEYA_MODELS": str(home / "models")}, check=False
    )
    # The doctor's h200 check fails on a host without CUDA (the next test pins that down); nothing else may.
    assert proc.returncode == 0 or "FAIL  h200     label h200 needs CUDA" in proc.stdout, proc.stdout
    unit = home / ".config" / "systemd" / "user" / "kakeya-runner.service"
    text = unit.read_text()
    lines = text.splitlines()
    assert f"ExecStart={VENV}/bin/kakeya runner watch --labels cpu,h200" in lines
    assert f"WorkingDirectory={ROOT}" in lines
    for env in (
        "KAKEYA_LABELS=cpu,h200",
        "KAKEYA_RUNNER_NAME=box-1",
        f"KAKEYA_REMOTE={bus}",
        f"KAKEYA_MODELS={home / 'models'}",
        "PYTHONUNBUFFERED=1",
    ):
        assert f'Environment="{env}"' in lines, env
    assert any(line.startswith(f'Environment="PATH={VENV}/bin:') for line in lines)
    assert f"EnvironmentFile=-{home}/.config/kakeya/runner.env" in lines
    assert "Restart=always" in lines and "RestartSec=10" in lines
    # a stop signals kakeya alone, which ends the current run in a done commit within the grace
    assert "KillMode=mixed" in lines and "KillMode=control-group" not in text
    assert "Environment=KAKEYA_STOP_GRACE=300" in lines and "TimeoutStopSec=360" in lines
    assert "WantedBy=default.target" in lines
    # The secrets file exists, is private, and holds no secret yet.
    secrets = home / ".config" / "kakeya" / "runner.env"
    assert secrets.stat().st_mode & 0o777 == 0o600
    assert all(line.startswith("#") for line in secrets.read_text().splitlines())
    # Dry run: the commands are printed, none is run (no systemd here would accept them anyway).
    for command in (
        "systemctl --user daemon-reload",
        "systemctl --user enable kakeya-runner.service",
        "systemctl --user restart kakeya-runner.service",
        "loginctl enable-linger",
    ):
        assert f"would run: {command}" in proc.stdout
    assert "+ systemctl" not in proc.stdout
    # The models directory is created and both places are named.
    assert (home / "kakeya-models").is_dir()
    assert "$KAKEYA_MODELS/NAME" in proc.stdout and f"{home}/kakeya-models" in proc.stdout
    assert "CPU build from https://download.pytorch.org/whl/cpu" in proc.stdout
    assert "skipped installing (--skip-install)" in proc.stdout
    analyze = shutil.which("systemd-analyze")
    if analyze:  # systemd's own parser: silent on a valid unit, names file:line for a bad directive
        out = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
        assert str(unit) not in out.stdout + out.stderr, out.stdout + out.stderr


def test_doctor_runs_against_the_hosts_bus_and_its_failure_is_the_scripts(home, bus, no_gpu_path, tmp_path):
    proc = setup(home, *service_args(bus), path=no_gpu_path, check=False)
    assert "== kakeya doctor" in proc.stdout and str(bus) in proc.stdout.split("== kakeya doctor")[1]
    doctor = proc.stdout.split("== kakeya doctor")[1]
    assert "ok    bus" in doctor
    # labels cpu,h200: the doctor checks that h200's CUDA is visible; on a host without one that (alone) fails
    failing = [ln for ln in doctor.splitlines() if ln.startswith("FAIL")]
    assert all(ln.startswith("FAIL  h200     label h200 needs CUDA") for ln in failing), doctor
    assert proc.returncode == (1 if failing else 0), proc.stdout + proc.stderr
    proc = setup(home, *service_args(tmp_path / "missing.git"), path=no_gpu_path, check=False)
    assert proc.returncode == 1
    assert "kakeya doctor reported problems (exit 1)" in proc.stdout
    # Everything else was still done: the unit is there, pointing at the (unreachable) remote.
    unit = (home / ".config" / "systemd" / "user" / "kakeya-runner.service").read_text()
    assert f'Environment="KAKEYA_REMOTE={tmp_path / "missing.git"}"' in unit


def test_service_step_runs_systemctl_and_stops_with_a_hint_when_it_fails(home, bus, no_gpu_path):
    bindir = Path(no_gpu_path.split(":")[0])
    calls = bindir / "calls"
    for tool in (
        "systemctl",
        "loginctl",
    ):  # stand-ins that record their arguments; restart can be made to fail
        (bindir / tool).write_text(
            f'#!/bin/sh\necho "{tool} $*" >> "{calls}"\n'
            f'if [ "$2" = restart ] && [ -n "$FAIL_RESTART" ]; then exit 3; fi\n'
        )
        (bindir / tool).chmod(0o755)
    args = [a for a in service_args(bus, "--no-doctor") if a != "--dry-run-service"] + ["--service"]
    proc = setup(home, *args, path=no_gpu_path)
    user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    assert calls.read_text().splitlines() == [
        f"loginctl enable-linger {user}",
        "systemctl --user daemon-reload",
        "systemctl --user enable kakeya-runner.service",
        "systemctl --user restart kakeya-runner.service",
    ]
    assert "+ systemctl --user restart kakeya-runner.service" in proc.stdout
    proc = setup(home, *args, path=no_gpu_path, env={"FAIL_RESTART": "1"}, check=False)
    assert proc.returncode == 1
    assert "'systemctl --user restart kakeya-runner.service' failed (exit 3)" in proc.stderr
    assert "log in as" in proc.stderr


def test_running_twice_gives_the_same_result(home, bus, no_gpu_path):
    first = setup(home, *service_args(bus, "--no-doctor"), path=no_gpu_path)
    before = snapshot(home)
    second = setup(home, *service_args(bus, "--no-doctor"), path=no_gpu_path)
    assert snapshot(home) == before
    assert "wrote:" in first.stdout and "wrote:" not in second.stdout
    assert "unchanged:" in second.stdout and "kept:" in second.stdout
    would = [line for line in first.stdout.splitlines() if line.startswith("would run:")]
    assert would and would == [line for line in second.stdout.splitlines() if line.startswith("would run:")]


def test_a_changed_option_rewrites_the_unit_and_keeps_the_secrets(home, bus, no_gpu_path):
    setup(home, *service_args(bus, "--no-doctor"), path=no_gpu_path)
    secrets = home / ".config" / "kakeya" / "runner.env"
    secrets.write_text("HF_TOKEN=hf_not_a_real_token\n")
    proc = setup(home, *service_args(bus, "--no-doctor", labels="h200"), path=no_gpu_path)
    unit = (home / ".config" / "systemd" / "user" / "kakeya-runner.service").read_text()
    assert f"ExecStart={VENV}/bin/kakeya runner watch --labels h200\n" in unit
    assert "cpu" not in unit
    assert secrets.read_text() == "HF_TOKEN=hf_not_a_real_token\n"
    assert "hf_not_a_real_token" not in proc.stdout + proc.stderr


def test_nvidia_smi_selects_the_cuda_build(home, bus, no_gpu_path, tmp_path):
    fake = Path(no_gpu_path.split(":")[0]) / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\necho 'GPU 1: NVIDIA H200 (UUID: GPU-1)'\n"
    )
    fake.chmod(0o755)
    proc = setup(home, *service_args(bus, "--no-doctor"), path=no_gpu_path)
    assert "torch==2.13.0, CUDA build (nvidia-smi lists 2 GPU(s)); kakeya[torch,serve]" in proc.stdout
    fake.write_text("#!/bin/sh\nexit 9\n")
    proc = setup(home, *service_args(bus, "--no-doctor"), path=no_gpu_path)
    assert "CPU build" in proc.stdout and "kakeya[torch,mlx,serve]" in proc.stdout


def test_macos_launch_agent_sources_the_secrets_and_keeps_the_watcher_alive(home, bus, no_gpu_path):
    args = service_args(bus, "--no-doctor", os="macos", labels="mac-m4", name="mini")
    proc = setup(home, *args, path=no_gpu_path)
    plist_path = home / "Library" / "LaunchAgents" / "dev.kakeya.runner.plist"
    plist = plistlib.loads(plist_path.read_bytes())
    args = plist["ProgramArguments"]
    assert args[-5:] == [f"{VENV}/bin/kakeya", "runner", "watch", "--labels", "mac-m4"]
    assert plist["EnvironmentVariables"]["KAKEYA_REMOTE"] == str(bus)
    assert plist["EnvironmentVariables"]["KAKEYA_LABELS"] == "mac-m4"
    assert plist["KeepAlive"] is True and plist["RunAtLoad"] is True
    assert plist["WorkingDirectory"] == str(ROOT)
    assert "would run: launchctl bootstrap" in proc.stdout
    assert "macOS build (Metal/MPS)" in proc.stdout
    # The wrapper really loads the secrets file, then execs the program it is given.
    secrets = home / ".config" / "kakeya" / "runner.env"
    secrets.write_text("HF_TOKEN=hf_from_file\n")
    wrapper = args[:-5] + ["/bin/sh", "-c", 'printf %s "$HF_TOKEN"']
    out = subprocess.run(wrapper, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, timeout=30)
    assert out.stdout == "hf_from_file"


def test_actions_runner_env_is_updated_in_place(home, bus, no_gpu_path, tmp_path):
    runner_dir = tmp_path / "actions-runner"
    runner_dir.mkdir()
    (runner_dir / ".env").write_text("LANG=C.UTF-8\nKAKEYA_VENV=/old/venv\n")
    args = [*service_args(bus, "--no-doctor"), "--actions-runner", str(runner_dir)]
    setup(home, *args, path=no_gpu_path)
    setup(home, *args, path=no_gpu_path)
    key = home / ".config" / "kakeya" / "signing-key"
    assert (runner_dir / ".env").read_text() == (
        f"LANG=C.UTF-8\nKAKEYA_VENV={VENV}\nKAKEYA_SIGNING_KEY={key}\nKAKEYA_ISOLATION=auto\n"
        "KAKEYA_RUN_USER=kakeya-run\n"
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--labels", "H200"], "label 'H200' must be lowercase"),
        (["--labels", "cpu,../x"], "label '../x'"),
        (["--torch", "rocm"], "--torch must be auto, cuda, cpu or none"),
        (["--os", "macos", "--torch", "cuda"], "there is no CUDA on macOS"),
        (["--bogus"], "unknown option --bogus"),
    ],
)
def test_bad_options_are_refused_before_anything_is_written(home, bus, args, message):
    proc = setup(home, "--venv", str(VENV), "--skip-install", "--remote", str(bus), *args, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert list(home.iterdir()) == []


def test_skip_install_needs_an_existing_venv(home, tmp_path):
    proc = setup(home, "--venv", str(tmp_path / "nowhere"), "--skip-install", check=False)
    assert proc.returncode == 1
    assert "there is no venv at" in proc.stderr and "run once without --skip-install" in proc.stderr


def test_one_runner_per_gpu_is_a_templated_unit_with_one_instance_per_gpu(home, bus, no_gpu_path):
    proc = setup(home, *service_args(bus, "--no-doctor"), "--gpus", "2", path=no_gpu_path)
    units = home / ".config" / "systemd" / "user"
    assert not (units / "kakeya-runner.service").exists()
    template = units / "kakeya-runner@.service"
    lines = template.read_text().splitlines()
    assert 'Environment="KAKEYA_RUNNER_NAME=box-1-gpu%i"' in lines
    assert 'Environment="CUDA_VISIBLE_DEVICES=%i"' in lines
    assert "Description=Kakeya runner box-1 on GPU %i (labels: cpu,h200)" in lines
    assert (
        f"ExecStart={VENV}/bin/kakeya runner watch --labels cpu,h200" in lines and "KillMode=mixed" in lines
    )
    assert "would run: systemctl --user enable kakeya-runner@0.service kakeya-runner@1.service" in proc.stdout
    assert (
        "would run: systemctl --user restart kakeya-runner@0.service kakeya-runner@1.service" in proc.stdout
    )
    analyze = shutil.which("systemd-analyze")
    if analyze:
        out = subprocess.run([analyze, "verify", str(template)], capture_output=True, text=True, timeout=60)
        assert "Unknown" not in out.stdout + out.stderr, out.stdout + out.stderr
    bad = setup(home, *service_args(bus, "--no-doctor"), "--gpus", "two", path=no_gpu_path, check=False)
    assert bad.returncode == 1 and "--gpus must be a number" in bad.stderr


def test_the_runner_gets_a_signing_key_and_the_line_to_commit(home, bus, no_gpu_path, tmp_path):
    from bridge.bus.trust import Signers, signature_problem
    from bridge.wire import git

    proc = setup(home, *service_args(bus, "--no-doctor"), path=no_gpu_path)
    key = home / ".config" / "kakeya" / "signing-key"
    assert key.stat().st_mode & 0o777 == 0o600
    kind, data = key.with_suffix(".pub").read_text().split()[:2]
    line = f'box-1@cpu+h200 namespaces="git" {kind} {data}'
    assert kind == "ssh-ed25519" and f"\n  {line}\n" in proc.stdout
    assert "BEGIN OPENSSH PRIVATE KEY" not in proc.stdout  # only the public half is printed
    unit = (home / ".config" / "systemd" / "user" / "kakeya-runner.service").read_text().splitlines()
    for env in (f"KAKEYA_SIGNING_KEY={key}", "KAKEYA_ISOLATION=auto", "KAKEYA_RUN_USER=kakeya-run"):
        assert f'Environment="{env}"' in unit, env
    secrets = home / ".config" / "kakeya" / "secrets"
    assert f'Environment="KAKEYA_SECRETS_DIR={secrets}"' in unit and secrets.stat().st_mode & 0o777 == 0o700
    # The line is what bridge/bus/trust.py reads, and a commit signed with the key verifies against it.
    allowed = tmp_path / "allowed-signers"
    allowed.write_text(line + "\n")
    signers = Signers.load(allowed)
    assert signers.labels == {"box-1@cpu+h200": frozenset({"cpu", "h200"})}
    repo = git.init_bare(tmp_path / "r.git")
    tree = git.tree_with(repo, None, {"a": b"x"})
    signed = git.commit(repo, tree, [], "signed", "box-1 <b@x>", str(key))
    assert signature_problem(repo, signed, signers, "the commit") is None
    unsigned = git.commit(repo, tree, [], "unsigned", "box-1 <b@x>")
    assert (signature_problem(repo, unsigned, signers, "the commit") or "").startswith("unsigned")
    # Run again: the key is kept, the same line printed.
    again = setup(home, *service_args(bus, "--no-doctor"), path=no_gpu_path)
    assert f"kept: {key}" in again.stdout and f"\n  {line}\n" in again.stdout


def test_the_run_user_is_made_as_root_and_dry_run_makes_nothing(home, bus, no_gpu_path):
    calls = Path(no_gpu_path.split(":")[0]) / "useradd.calls"
    useradd = "useradd --system --no-create-home --shell /usr/sbin/nologin kakeya-run"
    dry = setup(home, *service_args(bus, "--no-doctor"), path=no_gpu_path)
    root = os.geteuid() == 0
    if root:
        assert f"would run: {useradd}" in dry.stdout
    else:
        assert "not root: no run user made" in dry.stdout and "would run: useradd" not in dry.stdout
    assert not calls.exists()  # a dry run makes no user
    real = [a for a in service_args(bus, "--no-doctor") if a != "--dry-run-service"]
    proc = setup(home, *real, path=no_gpu_path)
    if root:
        assert calls.read_text().splitlines() == [useradd] and f"+ {useradd}" in proc.stdout
    else:
        assert not calls.exists()
    if shutil.which("bwrap"):  # the sandbox's package is there: nothing to install
        assert "bubblewrap installed: bubblewrap " in proc.stdout
        assert not (Path(no_gpu_path.split(":")[0]) / "install.calls").exists()
    existing = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    proc = setup(home, *service_args(bus, "--no-doctor"), "--run-user", existing, path=no_gpu_path)
    assert f"run user exists: {existing} (uid {os.getuid()})" in proc.stdout
    bad = setup(
        home, *service_args(bus, "--no-doctor"), "--run-user", "Bad User", path=no_gpu_path, check=False
    )
    assert bad.returncode == 1 and "--run-user 'Bad User' must be a user name" in bad.stderr


def recorders(path: str) -> Path:
    """systemctl, loginctl and launchctl stand-ins on `path` that record their arguments; the calls file."""
    bindir = Path(path.split(":")[0])
    for tool in ("systemctl", "loginctl", "launchctl"):
        (bindir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "{bindir}/calls"\n')
        (bindir / tool).chmod(0o755)
    return bindir / "calls"


def test_dry_run_writes_nothing_runs_nothing_and_says_what_it_would_do(home, bus, no_gpu_path, tmp_path):
    calls = recorders(no_gpu_path)
    venv = tmp_path / "venv"
    base = ["--venv", str(venv), "--labels", "h200", "--name", "box", "--remote", str(bus), "--dry-run"]
    proc = setup(home, "--os", "linux", *base, "--service", "--gpus", "2", path=no_gpu_path)
    assert list(home.iterdir()) == [] and not venv.exists()  # no venv, models dir, key, unit, env file
    bindir = Path(no_gpu_path.split(":")[0])
    assert not calls.exists() and not (bindir / "useradd.calls").exists()
    out = proc.stdout
    for said in (
        f"would create the venv: python3 -m venv {venv}",
        f"would install: kakeya[torch,mlx,serve] from {ROOT} (editable)",
        f"would create: {home}/kakeya-models",
        f"would make: {home}/.config/kakeya/signing-key",
        f"would write: {home}/.config/systemd/user/kakeya-runner@.service (mode 644)",
        "would run: systemctl --user restart kakeya-runner@0.service kakeya-runner@1.service",
        "would run: kakeya doctor",
        # the per-GPU units' logs, all of them
        "logs: journalctl --user -u 'kakeya-runner@*' -f",
    ):
        assert said in out, said
    assert "+ " not in out and "wrote:" not in out
    mac = setup(home, "--os", "macos", *base, "--service", "--no-doctor", path=no_gpu_path)
    assert list(home.iterdir()) == [] and not calls.exists()
    assert f"would write: {home}/Library/LaunchAgents/dev.kakeya.runner.plist (mode 644)" in mac.stdout
    # after a real setup, a dry run compares: what is the same is unchanged, a change would be written
    real = [*service_args(bus, "--no-doctor"), "--service"]
    setup(home, *[a for a in real if a != "--dry-run-service"], path=no_gpu_path)
    before, ran = snapshot(home), calls.read_text()
    again = setup(home, *real, "--dry-run", path=no_gpu_path)
    assert f"unchanged: {home}/.config/systemd/user/kakeya-runner.service" in again.stdout
    changed = setup(home, *real, "--dry-run", env={"KAKEYA_STOP_GRACE": "900"}, path=no_gpu_path)
    assert f"would write: {home}/.config/systemd/user/kakeya-runner.service" in changed.stdout
    assert snapshot(home) == before and calls.read_text() == ran


def test_the_stop_grace_reaches_the_launch_agent_and_the_unit(home, bus, no_gpu_path):
    """launchd SIGKILLs a job ExitTimeOut s after its SIGTERM (20 s unless set): a re-run of setup (bootout,
    bootstrap) must leave the runner its grace to finish the current run, as systemd's TimeoutStopSec does."""
    mac = ["--os", "macos", "--venv", str(VENV), "--skip-install", "--remote", str(bus), "--dry-run-service"]
    plist_path = home / "Library" / "LaunchAgents" / "dev.kakeya.runner.plist"
    setup(home, *mac, "--no-doctor", path=no_gpu_path)
    plist = plistlib.loads(plist_path.read_bytes())
    assert (plist["ExitTimeOut"], plist["EnvironmentVariables"]["KAKEYA_STOP_GRACE"]) == (360, "300")
    setup(home, *mac, "--no-doctor", path=no_gpu_path, env={"KAKEYA_STOP_GRACE": "900"})
    plist = plistlib.loads(plist_path.read_bytes())
    assert (plist["ExitTimeOut"], plist["EnvironmentVariables"]["KAKEYA_STOP_GRACE"]) == (960, "900")
    setup(home, *service_args(bus, "--no-doctor"), path=no_gpu_path, env={"KAKEYA_STOP_GRACE": "900"})
    unit = (home / ".config" / "systemd" / "user" / "kakeya-runner.service").read_text().splitlines()
    assert "Environment=KAKEYA_STOP_GRACE=900" in unit and "TimeoutStopSec=960" in unit
    bad = setup(home, *mac, path=no_gpu_path, env={"KAKEYA_STOP_GRACE": "5m"}, check=False)
    assert bad.returncode == 1 and "KAKEYA_STOP_GRACE must be a number of seconds" in bad.stderr


def test_rerunning_setup_on_a_mac_waits_for_the_old_agent_to_finish_its_run(home, bus, no_gpu_path, tmp_path):
    """launchctl stand-in: the agent stays loaded 2 s after bootout (its runner finishing the current run);
    the new agent is bootstrapped only once the old one is gone, never over it."""
    bindir = Path(no_gpu_path.split(":")[0])
    calls, loaded = bindir / "calls", tmp_path / "loaded"
    (bindir / "launchctl").write_text(
        f'#!/bin/sh\necho "launchctl $1" >> "{calls}"\n'
        f'case $1 in\n  print) [ -e "{loaded}" ] ;;\n'
        f'  bootout) (sleep 2; rm -f "{loaded}") >/dev/null 2>&1 & ;;\n'
        f'  bootstrap) touch "{loaded}" ;;\nesac\n'
    )
    (bindir / "launchctl").chmod(0o755)
    args = ["--os", "macos", "--venv", str(VENV), "--skip-install", "--remote", str(bus), "--service"]
    setup(home, *args, "--no-doctor", path=no_gpu_path)
    assert calls.read_text().split("\n")[:-1] == [
        "launchctl print",
        "launchctl enable",
        "launchctl bootstrap",
    ]
    calls.unlink()
    proc = setup(home, *args, "--no-doctor", path=no_gpu_path)
    seen = calls.read_text().splitlines()
    assert seen[:3] == ["launchctl print", "launchctl bootout", "launchctl print"]
    assert seen[-2:] == ["launchctl enable", "launchctl bootstrap"]
    assert seen.count("launchctl print") >= 3  # polled while the old agent finished (2 s)
    assert "a run in progress finishes first: up to 360 s" in proc.stdout


def fake_systemctl(bindir: Path, home: Path) -> Path:
    """systemctl and loginctl stand-ins that record their calls; `enable`/`disable` link and unlink the units in
    the user's default.target.wants as systemd does (what the script reads back as "enabled")."""
    calls = bindir / "calls"
    wants = home / ".config" / "systemd" / "user" / "default.target.wants"
    (bindir / "systemctl").write_text(
        f'#!/bin/sh\necho "systemctl $*" >> "{calls}"\n'
        f'wants="{wants}"\n'
        'case "$2" in\n'
        '  enable) shift 2; mkdir -p "$wants"; for u in "$@"; do ln -sf "../$u" "$wants/$u"; done ;;\n'
        '  disable) shift 2; for u in "$@"; do [ "$u" = --now ] || rm -f "$wants/$u"; done ;;\n'
        "esac\n"
    )
    (bindir / "loginctl").write_text(f'#!/bin/sh\necho "loginctl $*" >> "{calls}"\n')
    for tool in ("systemctl", "loginctl"):
        (bindir / tool).chmod(0o755)
    return calls


def test_rerunning_with_other_options_retires_the_units_it_no_longer_wants(home, bus, no_gpu_path):
    """Three runners served after `--gpus 2` then a plain `--service`: each setup now disables (and stops) the
    kakeya-runner units an earlier one enabled and this one does not want, and removes their files."""
    bindir = Path(no_gpu_path.split(":")[0])
    calls = fake_systemctl(bindir, home)
    units = home / ".config" / "systemd" / "user"
    wants = units / "default.target.wants"
    args = [a for a in service_args(bus, "--no-doctor") if a != "--dry-run-service"] + ["--service"]

    def enabled() -> list[str]:
        return sorted(p.name for p in wants.iterdir()) if wants.is_dir() else []

    def ran() -> list[str]:
        lines = calls.read_text().splitlines() if calls.exists() else []
        calls.unlink(missing_ok=True)
        return [ln for ln in lines if " disable " in ln]

    setup(home, *args, "--gpus", "2", path=no_gpu_path)
    assert enabled() == ["kakeya-runner@0.service", "kakeya-runner@1.service"] and ran() == []
    setup(home, *args, path=no_gpu_path)  # one runner again: the two per-GPU ones go
    assert enabled() == ["kakeya-runner.service"]
    assert ran() == [
        "systemctl --user disable --now kakeya-runner@0.service",
        "systemctl --user disable --now kakeya-runner@1.service",
    ]
    assert not (units / "kakeya-runner@.service").exists() and (units / "kakeya-runner.service").exists()
    setup(home, *args, "--gpus", "3", path=no_gpu_path)
    assert enabled() == [f"kakeya-runner@{i}.service" for i in range(3)]
    assert ran() == ["systemctl --user disable --now kakeya-runner.service"]
    assert not (units / "kakeya-runner.service").exists()
    setup(home, *args, "--gpus", "1", path=no_gpu_path)  # fewer GPUs: the extra instances go
    assert enabled() == ["kakeya-runner@0.service"]
    assert ran() == [
        "systemctl --user disable --now kakeya-runner@1.service",
        "systemctl --user disable --now kakeya-runner@2.service",
    ]
    # without --service nothing is changed, and it says what is still enabled
    plain = [a for a in args if a != "--service"]
    proc = setup(home, *plain, path=no_gpu_path)
    assert enabled() == ["kakeya-runner@0.service"] and ran() == []
    assert "an earlier --service left these enabled, unchanged now (without --service): kakeya-runner@0" in (
        proc.stdout
    )
    assert "systemctl --user disable --now kakeya-runner@0.service" in proc.stdout


def fake_venv(where: Path, pip_fails_with_index: bool = False) -> Path:
    """A venv whose python records `-m pip` calls (failing those with --index-url when asked: an index that
    cannot serve torch's dependencies) and answers every `-c` check as a Python 3.11+ without torch."""
    venv = where / "venv"
    (venv / "bin").mkdir(parents=True)
    fail = 'case "$*" in *--index-url*) echo "ERROR: No matching distribution found for filelock" >&2; exit 1 ;; esac\n'
    (venv / "bin" / "python").write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = -m ] && [ "$2" = pip ]; then echo "$*" >> "{venv}/pip.calls"\n'
        f"{fail if pip_fails_with_index else ''}exit 0\nfi\nexit 0\n"
    )
    (venv / "bin" / "kakeya").write_text("#!/bin/sh\nexit 0\n")
    for name in ("python", "kakeya"):
        (venv / "bin" / name).chmod(0o755)
    return venv


def test_torch_falls_back_to_the_package_registry_when_the_cpu_index_cannot_serve_it(
    home, bus, no_gpu_path, tmp_path
):
    venv = fake_venv(tmp_path, pip_fails_with_index=True)
    args = ["--venv", str(venv), "--torch", "cpu", "--labels", "cpu", "--remote", str(bus), "--no-doctor"]
    proc = setup(home, *args, path=no_gpu_path)
    pip = [ln for ln in (venv / "pip.calls").read_text().splitlines() if "torch" in ln or " -e " in ln]
    assert pip[0].endswith("torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"), pip
    assert pip[1].endswith("install --quiet --disable-pip-version-check torch==2.13.0"), pip  # the registry
    assert pip[2].endswith(f"-e {ROOT}[torch,mlx,serve]"), pip
    assert "is not reachable (or lacks a dependency): torch from the package registry" in proc.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root runner starts its runs as another user")
def test_a_python_the_run_user_cannot_reach_is_warned_about(home, bus, no_gpu_path, tmp_path):
    private = tmp_path / "root-home"  # as /root is: pyenv, uv and conda Pythons often live there
    private.mkdir(mode=0o700)
    venv = fake_venv(private)
    args = ["--venv", str(venv), "--skip-install", "--labels", "cpu", "--remote", str(bus), "--no-doctor"]
    proc = setup(home, *args, path=no_gpu_path)
    assert (
        f"warning: the run user (kakeya-run; nobody in the sandbox) cannot start {venv}/bin/python: {private}"
        in (proc.stdout)
    ), proc.stdout
    assert "Permission denied" in proc.stdout
    open_dir = Path(tempfile.mkdtemp(prefix="kakeya-open-"))  # /tmp/X, mode 755: open to every user
    try:
        open_dir.chmod(0o755)
        args[1] = str(fake_venv(open_dir))
        proc = setup(home, *args, path=no_gpu_path)
        assert "cannot start" not in proc.stdout, proc.stdout
    finally:
        shutil.rmtree(open_dir)


def slurm_repo(tmp_path: Path) -> Path:
    """A copy of the script in a checkout of its own (the script writes the runner config into its checkout)."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, repo / "scripts" / "setup-runner.sh")
    return repo


def test_slurm_writes_the_runner_config_for_a_slurm_executor(home, bus, no_gpu_path, tmp_path):
    from bridge.config import SlurmLabel, load_config

    repo = slurm_repo(tmp_path)
    script = str(repo / "scripts" / "setup-runner.sh")
    common = ["--venv", str(VENV), "--skip-install", "--remote", str(bus), "--no-doctor", "--name", "login1"]
    slurm = ["--slurm", "--labels", "h200", "--partition", "gpu", "--account", "ml", "--gpu-type", "h200"]

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        environ = {"HOME": str(home), "PATH": no_gpu_path, "LANG": "C.UTF-8"}
        proc = subprocess.run(
            ["bash", script, *args], env=environ, capture_output=True, text=True, timeout=120
        )
        assert not check or proc.returncode == 0, proc.stdout + proc.stderr
        return proc

    proc = run(*common, *slurm, "--dry-run-service")
    config = load_config(repo, environ={})
    assert config.executor_for("h200") == SlurmLabel(
        executor="slurm", partition="gpu", account="ml", gpu_type="h200", gpus=1
    )
    assert config.executor_for("cpu").executor == "local"
    unit = (home / ".config" / "systemd" / "user" / "kakeya-runner.service").read_text().splitlines()
    assert f"WorkingDirectory={repo}" in unit  # where the runner reads that config
    assert f"ExecStart={VENV}/bin/kakeya runner watch --labels h200" in unit
    assert "on a filesystem the compute nodes share" in proc.stdout.replace("\n", " ")
    assert (
        f"warning: the signing key {home}/.config/kakeya/signing-key lies in this home directory"
        in proc.stdout
    )
    assert 'docs/runners.md, "Slurm site checklist"' in proc.stdout
    # again: the same; a CPU partition asks for no GPU; a key elsewhere draws no warning
    assert "unchanged: " + str(repo / "kakeya.toml") in run(*common, *slurm).stdout
    key = tmp_path / "local-disk" / "signing-key"
    proc = run(*common, *slurm, "--slurm-gpus", "0", "--signing-key", str(key))
    assert load_config(repo, environ={}).executor_for("h200").gpus == 0  # type: ignore[union-attr]
    assert key.is_file() and "lies in this home directory" not in proc.stdout
    # without --slurm the label runs locally again: the config it wrote goes
    proc = run(*common, "--labels", "h200")
    assert not (repo / "kakeya.toml").exists() and "removed: " + str(repo / "kakeya.toml") in proc.stdout
    # a config of the site's own is never overwritten: the lines to add are printed
    (repo / "kakeya.toml").write_text('remote = "origin"\n')
    proc = run(*common, *slurm, check=False)
    assert proc.returncode == 1 and "was not written by this script: add to it yourself" in proc.stderr
    assert 'executor = "slurm"' in proc.stderr and (repo / "kakeya.toml").read_text() == 'remote = "origin"\n'
    for bad, why in (
        (["--slurm", "--labels", "h200,cpu"], "one label per Slurm runner"),
        (["--slurm", "--labels", "h200", "--gpus", "2"], "--slurm and --gpus"),
        (["--labels", "h200", "--partition", "gpu"], "--partition is for a Slurm label: add --slurm"),
        (["--slurm", "--labels", "h200", "--partition", "gpu --uid=0"], "must be a Slurm name"),
        (["--slurm", "--labels", "h200", "--slurm-gpus", "x"], "--slurm-gpus must be a number"),
    ):
        proc = run(*common, *bad, check=False)
        assert proc.returncode == 1 and why in proc.stderr, (bad, proc.stderr)
