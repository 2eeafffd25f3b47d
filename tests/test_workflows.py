"""The GitHub workflows: the linter passes on them and fails on broken copies; their security-relevant
shape; the route step's ref parsing; and the runner job's script end to end on a real local bus."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
FILES = sorted(WORKFLOWS.glob("*.yml"))
ACTIONLINT = Path(sys.executable).parent / "actionlint"
KAKEYA = Path(sys.executable).parent / "kakeya"
SHA = "0123456789abcdef0123456789abcdef01234567"


def run_script(
    name: str, env: dict[str, str], timeout: int = 60, root: Path = ROOT, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`bash .github/scripts/NAME` of `root` in `env` only (nothing of this process's environment)."""
    path = root / ".github" / "scripts" / name
    return subprocess.run(
        ["bash", str(path)], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def stand_in(path: Path, body: str, exit_code: int = 0) -> Path:
    """An executable /bin/sh script at `path` (a stand-in for kakeya or gh) that runs `body`."""
    path.write_text(f"#!/bin/sh\n{body}\nexit {exit_code}\n")
    path.chmod(0o755)
    return path


def load(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as true
    return data


def actionlint(*files: Path, path: str = "", cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    # An empty PATH: no shellcheck and no pyflakes for actionlint to find; it must pass without them.
    return subprocess.run(
        [str(ACTIONLINT), "-no-color", *map(str, files)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"PATH": path, "HOME": os.environ.get("HOME", "/")},
        timeout=120,
    )


# --- the linter -------------------------------------------------------------------------------------


def test_the_three_workflows_exist():
    assert {p.name for p in FILES} >= {"ci.yml", "runner.yml", "pr-gate.yml"}


def test_actionlint_passes_on_the_workflows_without_shellcheck():
    out = actionlint(*FILES)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_actionlint_passes_on_the_workflows_with_shellcheck():
    out = actionlint(*FILES, path=os.environ["PATH"])
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_the_shell_scripts_pass_shellcheck():
    scripts = [ROOT / "scripts" / "setup-runner.sh", *sorted((ROOT / ".github" / "scripts").glob("*.sh"))]
    out = subprocess.run(["shellcheck", *map(str, scripts)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


BREAKAGES = [
    ("runner.yml", "    needs: route\n", "    needs: rout\n", 'needs job "rout" which does not exist'),
    ("ci.yml", "runs-on: ${{ matrix.os }}", "runs-on: ${{ matrix.oss }}", 'property "oss" is not defined'),
    (
        "pr-gate.yml",
        "persist-credentials: false",
        "persist-credential: false",
        'input "persist-credential" is not defined',
    ),
    (
        "pr-gate.yml",
        "        run: bash harness/.github/scripts/pr-gate.sh",
        "        run: echo ${{ github.event.pull_request.title }}",
        "potentially untrusted",
    ),
    (
        "runner.yml",
        "      cancel-in-progress: false",
        "    cancel-in-progress: false",
        'unexpected key "cancel-in-progress" for "job" section',
    ),
    ("ci.yml", "name: ci\n", "name: [ci\n", "could not parse as YAML"),
]


@pytest.mark.parametrize("name, old, new, message", BREAKAGES, ids=[b[3] for b in BREAKAGES])
def test_actionlint_fails_on_a_broken_copy(tmp_path, name, old, new, message):
    target = tmp_path / ".github" / "workflows"
    target.mkdir(parents=True)
    text = (WORKFLOWS / name).read_text()
    assert old in text
    (target / name).write_text(text.replace(old, new, 1))
    out = actionlint(target / name, cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert message in out.stdout


def test_make_lint_runs_actionlint_on_the_workflows():
    makefile = (ROOT / "Makefile").read_text()
    assert "actionlint .github/workflows/*.yml" in makefile


# --- what the workflows do ----------------------------------------------------------------------------


def steps(job: dict) -> list[dict]:
    return job["steps"]


def checkout(job: dict) -> dict:
    found = [s for s in steps(job) if str(s.get("uses", "")).startswith("actions/checkout@")]
    assert len(found) == 1
    return found[0]["with"]


def test_runner_workflow_runs_the_default_branchs_harness_on_the_labelled_self_hosted_runner():
    wf = load("runner.yml")
    assert wf["on"]["push"] == {"branches": ["kakeya/req/**"]}
    assert wf["permissions"]["contents"] == "write"
    job = wf["jobs"]["run"]
    assert job["runs-on"] == ["self-hosted", "${{ needs.route.outputs.label }}"]
    assert job["concurrency"] == {
        "group": "kakeya-runner-${{ needs.route.outputs.label }}",
        "cancel-in-progress": False,
    }
    co = checkout(job)
    assert co["ref"] == "${{ github.event.repository.default_branch }}"
    assert co["persist-credentials"] is False and co["path"] == "harness"
    runs = [s["run"] for s in steps(job) if "run" in s]
    assert runs == ["bash harness/.github/scripts/runner-job.sh"]
    upload = [s for s in steps(job) if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    assert upload and upload[0]["with"]["path"] == "${{ runner.temp }}/kakeya-results/"
    assert "cancelled()" in upload[0]["if"]


def test_pr_gate_checks_out_the_base_and_never_the_head():
    wf = load("pr-gate.yml")
    # the workflow file comes from the base (a PR cannot rewrite its check), and a merge queue is gated too
    assert "pull_request_target" in wf["on"] and "merge_group" in wf["on"]
    assert "pull_request" not in wf["on"] and "push" not in wf["on"]
    # the token writes nothing but pull-request comments (the evidence comment) and commit statuses (the verdict)
    assert wf["permissions"] == {"contents": "read", "pull-requests": "write", "statuses": "write"}
    # the run's title names the commit it gates: GitHub records a pull_request_target run under the base's sha,
    # and runner-job.sh finds the run to re-run by its title
    assert wf["run-name"].startswith("kakeya gate ${{ github.event.pull_request.head.sha || inputs.subject")
    text = (WORKFLOWS / "pr-gate.yml").read_text()
    assert "head.ref" not in text and "head.repo" not in text and "merge_group.head_sha" not in text
    job = wf["jobs"]["gate"]
    co = checkout(job)
    assert co["ref"].startswith("${{ github.event.pull_request.base.sha")
    assert "head" not in co["ref"] and co["persist-credentials"] is False
    gate = next(s for s in steps(job) if s.get("id") == "gate")
    assert gate["run"] == "bash harness/.github/scripts/pr-gate.sh"
    assert gate["env"]["SUBJECT"].startswith("${{ github.event.pull_request.head.sha")
    assert gate["env"]["BASE"] == "${{ github.event.pull_request.base.sha }}"
    # the comment: after the gate (also when it failed), on pull requests only, from the base's script
    post = steps(job)[-1]
    assert post["run"] == "bash harness/.github/scripts/pr-comment.sh"
    assert "!cancelled()" in post["if"] and "github.event_name == 'pull_request_target'" in post["if"]
    assert post["env"]["GH_TOKEN"] == "${{ github.token }}"


def test_a_merge_queue_entry_is_gated_on_its_prs_head(tmp_path):
    """The merge_group step, run by bash with a stand-in `gh` that answers the pulls API."""
    step = next(s for s in steps(load("pr-gate.yml")["jobs"]["gate"]) if s.get("id") == "queued")
    gh = tmp_path / "gh"
    gh.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/gh-argv\necho {SHA}\n')
    gh.chmod(0o755)
    out = tmp_path / "out"
    env = {
        "PATH": f"{tmp_path}:{os.environ['PATH']}",
        "HEAD_REF": "refs/heads/gh-readonly-queue/main/pr-17-" + "ab" * 20,
        "REPO": "o/r",
        "GITHUB_OUTPUT": str(out),
    }
    proc = subprocess.run(["bash", "-c", step["run"]], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == f"pr=17\nsha={SHA}\n"
    assert (tmp_path / "gh-argv").read_text().split() == ["api", "repos/o/r/pulls/17", "--jq", ".head.sha"]
    env["HEAD_REF"] = "refs/heads/main"
    proc = subprocess.run(["bash", "-c", step["run"]], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "cannot find the PR number" in proc.stdout


@pytest.mark.parametrize(
    "status, verdict, state", [("succeeded", "pass", "success"), ("succeeded", "fail", "failure")]
)
def test_runner_job_posts_a_commit_status_and_reruns_the_subjects_failed_gate(
    tmp_path, status, verdict, state
):
    """runner-job.sh's notify(), run by bash with a stand-in curl that logs each call and answers the runs query."""
    text = (ROOT / ".github" / "scripts" / "runner-job.sh").read_text()
    start = text.index("notify() {")
    body = text[start : text.index("\n}\n", start) + 3]
    rid = "20260101T000000.000Z-probe-abcdef"
    (tmp_path / "results" / rid).mkdir(parents=True)
    result = {"status": status, "verdict": verdict, "preset": "probe", "request_id": rid, "subject": SHA}
    (tmp_path / "results" / rid / "result.json").write_text(json.dumps(result))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "curl").write_text(
        "#!/bin/sh\n"
        f'printf "%s " "$@" >> {tmp_path}/curl.log; echo >> {tmp_path}/curl.log\n'
        'case "$*" in *"/runs?"*) cat ' + str(tmp_path / "runs.json") + " ;; esac\n"
    )
    (bindir / "curl").chmod(0o755)
    # as GitHub records pr-gate.yml's runs: a pull_request_target run under the base's sha, titled by its run-name
    base = "b" * 40
    runs = [(41, SHA), (42, SHA), (43, "c" * 40)]
    (tmp_path / "runs.json").write_text(
        json.dumps(
            {
                "workflow_runs": [
                    {"id": i, "head_sha": base, "display_title": f"kakeya gate {s}"} for i, s in runs
                ]
            }
        )
    )
    script = f'error() {{ echo "::error::$*"; }}\nPY={sys.executable}\nOUT={tmp_path}/results\nLABEL=cpu\n{body}notify {rid}\n'
    env = {
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "GITHUB_TOKEN": "ghs_x",
        "GITHUB_REPOSITORY": "org/kakeya",
        "GITHUB_API_URL": "https://api.invalid",
        "GITHUB_SERVER_URL": "https://github.com",
        "GITHUB_RUN_ID": "9",
    }
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "::error::" not in proc.stdout, proc.stdout + proc.stderr
    calls = (tmp_path / "curl.log").read_text().splitlines()
    assert len(calls) == 4
    api = "https://api.invalid/repos/org/kakeya"
    assert f"{api}/statuses/{SHA}" in calls[0]
    posted = json.loads(calls[0].split(f"{api}/statuses/{SHA} -d ", 1)[1])
    assert posted == {
        "state": state,
        "context": "kakeya/probe@cpu",
        "description": f"{rid}: " + ("succeeded" if state == "success" else "ran, gate failed"),
        "target_url": "https://github.com/org/kakeya/actions/runs/9",
    }
    assert f"{api}/actions/workflows/pr-gate.yml/runs?status=failure" in calls[1]
    assert (
        f"{api}/actions/runs/41/rerun-failed-jobs" in calls[2]
        and f"{api}/actions/runs/42/rerun-failed-jobs" in calls[3]
    )


def test_ci_runs_make_test_on_linux_and_macos_with_a_pip_cache_and_skips_bus_refs():
    wf = load("ci.yml")
    assert wf["on"]["push"] == {"branches-ignore": ["kakeya/**"]}
    job = wf["jobs"]["test"]
    assert {m["os"] for m in job["strategy"]["matrix"]["include"]} == {"ubuntu-latest", "macos-14"}
    setup_python = [s for s in steps(job) if str(s.get("uses", "")).startswith("actions/setup-python@")][0]
    assert setup_python["with"]["cache"] == "pip"
    assert steps(job)[-1]["run"].startswith("make test")


# --- the route step: label and id from the pushed ref ----------------------------------------------------


def route(tmp_path: Path, ref: str, event: str = "push", label: str = "") -> tuple[int, dict[str, str], str]:
    script = load("runner.yml")["jobs"]["route"]["steps"][0]["run"]
    output = tmp_path / "output"
    output.write_text("")
    env = {
        "PATH": os.environ["PATH"],
        "EVENT": event,
        "REF": ref,
        "INPUT_LABEL": label,
        "GITHUB_OUTPUT": str(output),
    }
    proc = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30, cwd=tmp_path
    )
    values = dict(line.split("=", 1) for line in output.read_text().splitlines())
    return proc.returncode, values, proc.stdout


def test_route_parses_label_and_id(tmp_path):
    rc, out, _ = route(tmp_path, "refs/heads/kakeya/req/h200/20260614T101502.123Z-niah-ladder-a1b2c3")
    assert rc == 0 and out == {"label": "h200", "request": "20260614T101502.123Z-niah-ladder-a1b2c3"}
    rc, out, _ = route(tmp_path, "refs/heads/main", event="workflow_dispatch", label="mac-m4")
    assert rc == 0 and out == {"label": "mac-m4", "request": ""}


@pytest.mark.parametrize(
    "ref, event, label",
    [
        ("refs/heads/kakeya/req/H200/20260614T101502.123Z-probe-a1b2c3", "push", ""),
        ("refs/heads/kakeya/req/cpu/x/20260614T101502.123Z-probe-a1b2c3", "push", ""),
        ("refs/heads/kakeya/req/cpu/20260614T101502.123Z-probe-a1b2c3;touch${IFS}pwned", "push", ""),
        ("refs/heads/kakeya/req/$(touch pwned)/20260614T101502.123Z-probe-a1b2c3", "push", ""),
        ("refs/heads/main", "workflow_dispatch", "cpu,h200"),
    ],
)
def test_route_refuses_anything_else(tmp_path, ref, event, label):
    rc, out, stdout = route(tmp_path, ref, event, label)
    assert rc == 1 and out == {}
    assert "::error::" in stdout
    assert not (tmp_path / "pwned").exists()


# --- the PR gate's requirements ------------------------------------------------------------------------------


def required(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / ".github" / "scripts" / "required.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_repositorys_requirements_name_existing_presets_and_their_runners():
    out = required("--presets", str(ROOT / "presets"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() and all("@" in line for line in out.stdout.split())


@pytest.mark.parametrize(
    "text, message",
    [
        ("required: [probe]\n", "must look like PRESET@LABEL"),
        ("required: [probe@cpu, probe@cpu]\n", "listed twice"),
        ("required: [probe@gpu9]\n", "preset probe runs on"),
        ("required: [nope@cpu]\n", "there is no preset nope"),
        ("require: [probe@cpu]\n", "Extra inputs are not permitted"),
        ("required: [probe@cpu\n", "cannot read YAML"),
    ],
)
def test_bad_requirements_are_refused(tmp_path, text, message):
    path = tmp_path / "required.yml"
    path.write_text(text)
    out = required(str(path), "--presets", str(ROOT / "presets"))
    assert out.returncode == 2 and message in out.stderr and out.stdout == ""


# --- the runner job on a real bus ------------------------------------------------------------------------------


@pytest.fixture
def bus(tmp_path: Path) -> tuple[Path, Path]:
    """A bare repository as the bus, and a clone of this project (committed HEAD) to request runs of."""
    remote = tmp_path / "bus.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    subject = tmp_path / "subject"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(subject)], check=True, timeout=120)
    return remote, subject


def request(subject: Path, remote: Path, preset: str = "probe") -> str:
    out = subprocess.run(
        [str(KAKEYA), "request", preset, "--runner", "cpu", "--remote", str(remote)],
        cwd=subject,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def job(
    tmp_path: Path, remote: Path, request_id: str, **env: str
) -> tuple[subprocess.CompletedProcess[str], str]:
    temp, summary, home = tmp_path / "runner-temp", tmp_path / "summary.md", tmp_path / "home"
    for d in (temp, home):
        d.mkdir(exist_ok=True)
    summary.write_text("")
    environ = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "LABEL": "cpu",
        "REQUEST": request_id,
        "KAKEYA_REMOTE": str(remote),
        "KAKEYA_VENV": sys.prefix,
        "RUNNER_TEMP": str(temp),
        "GITHUB_STEP_SUMMARY": str(summary),
        "RUNNER_NAME": "gh runner 1",
        **env,
    }
    return run_script("runner-job.sh", environ, timeout=600), summary.read_text()


def done_ids(remote: Path) -> set[str]:
    out = subprocess.run(
        ["git", "for-each-ref", "--format=%(refname:lstrip=3)", "refs/kakeya/done/"],
        cwd=remote,
        capture_output=True,
        text=True,
        check=True,
    )
    return set(out.stdout.split())


@pytest.mark.slow
def test_runner_job_serves_its_request_then_a_dispatched_drain_serves_the_one_whose_trigger_was_dropped(
    tmp_path, bus
):
    remote, subject = bus
    # The commit under test carries its own copy of the probe preset with a gate it would fail: the job must
    # judge it by the trusted checkout's preset instead.
    preset = subject / "presets" / "probe.yaml"
    preset.write_text(preset.read_text().replace("cpu_count, value: 1}", "cpu_count, value: 100000}"))
    assert "100000" in preset.read_text()
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "tighten"],
        cwd=subject,
        check=True,
    )
    first, second = request(subject, remote), request(subject, remote)
    # A fake curl records the dispatch call (no network); its URL and body are what GitHub would get.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "curl").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$(dirname "$0")/curl.args"\n')
    (bindir / "curl").chmod(0o755)

    # Job 1 (trigger of `first`; `second`'s trigger was the pending job GitHub cancelled). Its drain
    # budget is spent by `first` alone, so it dispatches a drain for the label.
    proc, summary = job(
        tmp_path,
        remote,
        first,
        PATH=f"{bindir}:{os.environ['PATH']}",
        KAKEYA_DRAIN_SECONDS="1",
        GITHUB_TOKEN="ghs_not_a_real_token",
        GITHUB_REPOSITORY="org/kakeya",
        GITHUB_WORKFLOW_REF="org/kakeya/.github/workflows/runner.yml@refs/heads/kakeya/req/cpu/x",
        DEFAULT_BRANCH="main",
        GITHUB_API_URL="https://api.invalid",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert done_ids(remote) == {first}
    results = tmp_path / "runner-temp" / "kakeya-results" / first
    result = json.loads((results / "result.json").read_text())
    assert (
        result["status"] == "succeeded" and result["verdict"] == "pass"
    )  # the trusted gate, not the subject's
    assert (results / "report.json").is_file() and (results / "logs" / "stdout.log").is_file()
    assert first in summary and "probe: succeeded" in summary and second not in summary
    args = (bindir / "curl.args").read_text().splitlines()
    assert "https://api.invalid/repos/org/kakeya/actions/workflows/runner.yml/dispatches" in args
    assert json.loads(args[-1]) == {"ref": "main", "inputs": {"label": "cpu"}}
    assert "ghs_not_a_real_token" not in proc.stdout + proc.stderr

    # Job 2: the dispatched drain (no request id) serves `second`, then finds nothing and stops.
    (bindir / "curl.args").unlink()
    proc, summary = job(tmp_path, remote, "", PATH=f"{bindir}:{os.environ['PATH']}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert done_ids(remote) == {first, second}
    assert second in summary and "drained 1 more request(s) for cpu" in proc.stdout
    assert not (bindir / "curl.args").exists()

    # Job 3: a late trigger for a request someone else already served: nothing runs, its results show.
    proc, summary = job(tmp_path, remote, first)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "nothing to do" in proc.stderr and first in summary


def test_runner_job_without_a_venv_says_how_to_make_one(tmp_path):
    proc, _ = job(tmp_path, tmp_path / "bus.git", "", KAKEYA_VENV=str(tmp_path / "none"))
    assert proc.returncode == 1
    assert "no Kakeya venv at" in proc.stdout and "scripts/setup-runner.sh" in proc.stdout


# --- the PR gate's script on a real bus --------------------------------------------------------------------


def pr_gate(tmp_path: Path, remote: Path, subject: str) -> tuple[subprocess.CompletedProcess[str], str]:
    summary = tmp_path / "gate-summary.md"
    summary.write_text("")
    env = {
        "PATH": f"{KAKEYA.parent}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
        "SUBJECT": subject,
        "PR": "42",
        "KAKEYA_REMOTE": str(remote),
        "GITHUB_STEP_SUMMARY": str(summary),
        "GITHUB_RUN_ID": "777",
        "ALLOW_UNSIGNED": "true",  # the repository ships no allowed-signers file: its setting allows unsigned
        **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}),
    }
    return run_script("pr-gate.sh", env, timeout=300), summary.read_text()


@pytest.mark.slow
def test_pr_gate_passes_with_evidence_and_says_how_to_get_it_without(tmp_path, bus):
    remote, subject = bus
    entries = required().stdout.split()
    assert entries
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=subject, capture_output=True, text=True, check=True
    ).stdout.strip()
    # No evidence yet: the check fails and the summary gives one request command per requirement.
    proc, summary = pr_gate(tmp_path, remote, head)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "::error::" in proc.stdout
    assert "git fetch origin pull/42/head" in summary and "gh run rerun --failed 777" in summary
    for entry in entries:
        preset, label = entry.split("@")
        assert f"kakeya request {preset} --runner {label} --subject {head} --wait" in summary
    # Evidence for every requirement, served by a runner: the check passes.
    for entry in entries:
        preset, label = entry.split("@")
        rid = (
            request(subject, remote, preset)
            if label == "cpu"
            else pytest.skip(f"{entry} needs a {label} runner")
        )
        served = subprocess.run(
            [str(KAKEYA), "runner", "once", "--request", rid, "--labels", label, "--remote", str(remote)],
            cwd=subject,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        assert served.returncode == 0, served.stderr
    proc, summary = pr_gate(tmp_path, remote, head)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert head in summary and "How to provide the evidence" not in summary


def pr_env(kakeya: Path, **more: str) -> dict[str, str]:
    """pr-gate.sh's environment for PR 42 of subject SHA, with `kakeya` standing in for the CLI."""
    path = f"{KAKEYA.parent}:{os.environ['PATH']}"
    return {"PATH": path, "SUBJECT": SHA, "PR": "42", "KAKEYA": str(kakeya), "GITHUB_RUN_ID": "777", **more}


def gate_stand_in(tmp_path: Path, flag: str, text: str, verdict: int) -> Path:
    """A stand-in for `kakeya gate pr`: records its argv in tmp_path/argv, writes `text` (printf) to the file
    after `flag`, exits `verdict`."""
    return stand_in(
        tmp_path / "kakeya-stand-in",
        f"""printf '%s\\n' "$@" > "{tmp_path}/argv"
while [ $# -gt 1 ]; do [ "$1" = {flag} ] && printf "{text}" > "$2"; shift; done""",
        verdict,
    )


@pytest.mark.parametrize("verdict", [0, 1])
def test_pr_gate_script_builds_the_gate_command_from_the_requirements(tmp_path, verdict):
    """`kakeya gate pr` replaced by a stand-in that records its arguments: what the script asks and writes."""
    kakeya = gate_stand_in(tmp_path, "--summary", "| the gate's table |\\n", verdict)
    summary = tmp_path / "summary.md"
    proc = run_script("pr-gate.sh", pr_env(kakeya, GITHUB_STEP_SUMMARY=str(summary)))
    assert proc.returncode == verdict, proc.stdout + proc.stderr
    argv = (tmp_path / "argv").read_text().splitlines()
    entries = required().stdout.split()
    assert argv[:4] == ["gate", "pr", "--subject", SHA]
    assert argv[4:-2] == [x for entry in entries for x in ("--require", entry)]
    assert argv[-2] == "--summary"
    text = summary.read_text()
    assert f"## Kakeya evidence for {SHA}" in text and "| the gate's table |" in text
    assert ("How to provide the evidence" in text) == bool(verdict)
    if verdict:
        preset, label = entries[0].split("@")
        assert f"kakeya request {preset} --runner {label} --subject {SHA} --wait" in text
        assert f"kakeya evidence {SHA} --request-missing --wait --remote origin" in text  # all at once
        assert "git fetch origin pull/42/head" in text and "gh run rerun --failed 777" in text


@pytest.mark.parametrize("verdict", [0, 1])
def test_pr_gate_script_asks_for_the_comment_against_the_base_and_adds_the_instructions(tmp_path, verdict):
    """With COMMENT and BASE (a pull request): `kakeya gate pr` writes the comment, compared with the base and
    linked under the repository's web address; on a failure the instructions are appended to it too."""
    kakeya = gate_stand_in(tmp_path, "--comment", "<!-- kakeya-evidence -->\\n| table |\\n", verdict)
    comment = tmp_path / "comment.md"
    base = "f" * 40
    env = pr_env(
        kakeya,
        COMMENT=str(comment),
        BASE=base,
        GITHUB_SERVER_URL="https://github.com",
        GITHUB_REPOSITORY="org/kakeya",
    )
    proc = run_script("pr-gate.sh", env)
    assert proc.returncode == verdict, proc.stdout + proc.stderr
    argv = (tmp_path / "argv").read_text().splitlines()
    i = argv.index("--comment")
    assert argv[i : i + 6] == [
        "--comment",
        str(comment),
        "--base",
        base,
        "--link-base",
        "https://github.com/org/kakeya",
    ]
    text = comment.read_text()
    assert text.startswith("<!-- kakeya-evidence -->\n| table |\n")
    assert ("### How to provide the evidence" in text) == bool(verdict)
    if verdict:
        assert f"--subject {SHA} --wait" in text and "gh run rerun --failed 777" in text


def pr_comment(
    tmp_path: Path, comment: Path, pr: str, listed: str = ""
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """pr-comment.sh with a stand-in `gh` that logs its arguments and prints `listed` for the listing."""
    stand_in(
        tmp_path / "gh",
        f"""printf '%s|' "$@" >> "{tmp_path}/gh.log"; echo >> "{tmp_path}/gh.log"
case "$*" in *--paginate*) printf '%s' '{listed}' ;; esac""",
    )
    env = {
        "PATH": f"{tmp_path}:{os.environ['PATH']}",
        "COMMENT": str(comment),
        "REPO": "org/kakeya",
        "PR": pr,
    }
    proc = run_script("pr-comment.sh", env)
    log = tmp_path / "gh.log"
    return proc, log.read_text().splitlines() if log.exists() else []


def test_pr_comment_posts_once_then_edits_its_own_and_refuses_what_is_not_a_comment(tmp_path):
    """The listing's jq keeps only the workflow's own marker comment (real gh: tests/test_act.py); here the
    stand-in answers with an id or nothing: POST when none, PATCH of that id when one."""
    comment = tmp_path / "comment.md"
    comment.write_text("<!-- kakeya-evidence -->\nbody\n")
    proc, calls = pr_comment(tmp_path, comment, "42")
    assert proc.returncode == 0, proc.stderr
    assert calls[0].startswith("api|--paginate|repos/org/kakeya/issues/42/comments|--jq|")
    assert (
        'select(.user.login == "github-actions[bot]" and (.body | startswith("<!-- kakeya-evidence -->")))'
        in calls[0]
    )
    assert calls[1] == f"api|--method|POST|repos/org/kakeya/issues/42/comments|-F|body=@{comment}|"
    (tmp_path / "gh.log").unlink()
    proc, calls = pr_comment(tmp_path, comment, "42", listed="1001\n")
    assert proc.returncode == 0 and "updated the evidence comment 1001" in proc.stdout
    assert calls[1] == f"api|--method|PATCH|repos/org/kakeya/issues/comments/1001|-F|body=@{comment}|"
    (tmp_path / "gh.log").unlink()
    # a PR number that is not one, and a comment file the gate did not write (no marker): no call at all
    proc, calls = pr_comment(tmp_path, comment, "42/../../x")
    assert proc.returncode == 1 and "is not a pull request number" in proc.stdout and calls == []
    comment.write_text("something else\n")
    proc, calls = pr_comment(tmp_path, comment, "42")
    assert proc.returncode == 0 and "::warning::" in proc.stdout and calls == []
    comment.unlink()
    proc, calls = pr_comment(tmp_path, comment, "42")
    assert proc.returncode == 0 and "::warning::" in proc.stdout and calls == []


@pytest.mark.parametrize("signed", [False, True])
def test_pr_gate_passes_the_allowed_signers_of_the_base_checkout(tmp_path, signed):
    """The script, copied into a stand-in base checkout, hands `kakeya gate pr` that checkout's
    allowed-signers file by absolute path (when it has one), never a file from the PR's head or the cwd."""
    base = tmp_path / "base"
    shutil.copytree(ROOT / ".github" / "scripts", base / ".github" / "scripts")
    shutil.copy(ROOT / ".github" / "kakeya-required.yml", base / ".github" / "kakeya-required.yml")
    shutil.copytree(ROOT / "presets", base / "presets")
    if signed:
        (base / ".github" / "kakeya-allowed-signers").write_text(
            'gpu-1@h200 namespaces="git" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBase\n'
        )
    head = tmp_path / "head"  # the PR's head, with a file of its own: the cwd the job could be in
    (head / ".github").mkdir(parents=True)
    (head / ".github" / "kakeya-allowed-signers").write_text(
        'evil@h200 namespaces="git" ssh-ed25519 AAAAevil\n'
    )
    kakeya = stand_in(
        tmp_path / "kakeya-stand-in", f"printf '%s\\n' \"$@\" > {tmp_path}/argv\npwd > {tmp_path}/cwd"
    )
    env = {"PATH": os.environ["PATH"], "SUBJECT": SHA, "KAKEYA": str(kakeya)}
    if not signed:  # the repository's setting KAKEYA_ALLOW_UNSIGNED=true: gate pr is told so
        env["ALLOW_UNSIGNED"] = "true"
    proc = run_script("pr-gate.sh", env, root=base, cwd=head)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    argv = (tmp_path / "argv").read_text().splitlines()
    assert (tmp_path / "cwd").read_text().strip() == str(
        base.resolve()
    )  # gate pr's default is the base's too
    if signed:
        i = argv.index("--allowed-signers")
        assert argv[i + 1] == str(base.resolve() / ".github" / "kakeya-allowed-signers")
        assert "--allow-unsigned" not in argv
    else:
        assert "--allowed-signers" not in argv and "--allow-unsigned" in argv
    assert "evil" not in " ".join(argv)


def test_runner_job_says_its_own_runner_once_failed_not_that_another_runner_holds_it(tmp_path):
    """`runner once` fails here (the bus cannot be reached): the summary says this runner could not serve it,
    never "another runner holds it"; the job fails."""
    rid = "20260614T101502.123Z-probe-a1b2c3"
    proc, summary = job(tmp_path, tmp_path / "no-such-bus.git", rid)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"kakeya runner once --request {rid} failed" in proc.stdout
    assert "Not served: `kakeya runner once` failed on runner gh-runner-1" in summary, summary
    assert "another runner holds it" not in summary
