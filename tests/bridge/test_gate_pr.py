"""`kakeya gate pr` against a real bus: real requests, an in-process runner, evidence re-gated with the local
registry. Missing evidence, evidence for another commit, failing reports, reports and done commits edited
after the run, passing evidence; exit codes, stdout and the appended, capped job summary."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from bridge import evidence as E
from bridge.bus.bus import RESULTS_STORE, Bus
from bridge.bus.records import MANIFEST_PATH, done_ref, indexed_subject, new_id, results_path
from bridge.cli.main import main
from bridge.client.client import Client
from bridge.config import load_config
from bridge.core.errors import InvalidRequest
from bridge.presets.registry import load_registry
from bridge.wire import git as G
from tests.bridge.bus_support import (
    PRESETS,
    Env,
    git,
    make_runner,
    manifest_dict,
    move_done,
    push_raw_request,
)

ROOT = Path(__file__).resolve().parents[2]


class LocalBus:
    """A bare bus in the test's temp dir, a client for it and one runner serving cpu."""

    def __init__(self, env: Env, url: str | None = None):
        self.env = env
        self.url = url or str(G.init_bare(env.tmp / "bus.git"))
        self.client = Client(load_config(), remote=self.url)
        self.runner = make_runner(self.url, env)

    def run(self, preset: str, label: str = "cpu", **params: str) -> str:
        rid = self.client.request(preset, params, label).id
        served = self.runner.once(request_id=rid)
        assert served is not None and served.pushed
        return rid

    def not_run(self) -> tuple[str, str]:
        """Two work@cpu requests served without running: one expired, one cancelled (their ids)."""
        expired = self.client.request("work", {}, "cpu", expires_s=0.001).id
        time.sleep(0.05)
        assert self.runner.once(request_id=expired).status == "expired"
        cancelled = self.client.request("work", {}, "cpu").id
        self.client.cancel(cancelled)
        assert self.runner.once(request_id=cancelled).status == "cancelled"
        return expired, cancelled

    def done(self, rid: str) -> str:
        return Bus(self.url, self.env.project).ls_remote(done_ref(rid)).refs[done_ref(rid)]

    def files(self, rid: str) -> dict[str, bytes]:
        """The done commit's .kakeya/results/<id>/ files, fetched into the project."""
        Bus(self.url, self.env.project).fetch([done_ref(rid)])
        repo = self.env.project
        return G.read_dir(repo, self.done(rid), results_path(rid))

    def push_done(self, rid: str, parent: str, files: dict[str, bytes], replace: bool) -> str:
        """A done commit on `parent` with `files` (paths relative to the repository), pushed as kakeya/done/<rid>
        (force-moving it when `replace`), as someone with push access to the bus could."""
        repo = self.env.project
        sha = G.child_commit(repo, parent, files, "edited after the run", "Mallory <m@example.com>")
        expect = self.done(rid) if replace else None
        assert expect is not None or done_ref(rid) not in Bus(self.url, repo).ls_remote(done_ref(rid)).refs
        # as anyone with push access could, it is indexed under every subject its files name
        named = set()
        for path in (MANIFEST_PATH, f"{results_path(rid)}/result.json"):
            try:
                named.add(json.loads(G.read_path(repo, sha, path) or b"{}").get("subject"))
            except ValueError:
                pass
        move_done(
            self.url, repo, rid, sha, tuple(s for s in named if isinstance(s, str) and indexed_subject(s))
        )
        return sha


def commit(env: Env, name: str) -> str:
    (env.project / name).write_text(name)
    git(env.project, "add", name)
    git(env.project, "commit", "-qm", name)
    return git(env.project, "rev-parse", "HEAD")


def gate(
    bus: LocalBus | str,
    subject: str,
    *require: str,
    summary: Path | None = None,
    as_json: bool = False,
    allow_unsigned: bool = True,
) -> int:
    """`kakeya gate pr` on the bus (or its URL; a shared bus: unsigned evidence is allowed only with
    `allow_unsigned`)."""
    args = ["gate", "pr", "--subject", subject, "--remote", bus if isinstance(bus, str) else bus.url]
    if allow_unsigned:
        args.append("--allow-unsigned")
    for r in require:
        args += ["--require", r]
    if summary is not None:
        args += ["--summary", str(summary)]
    return main(args + (["--json"] if as_json else []))


# what a line says of unsigned evidence from this host, run with `work`'s defaults (`unsigned(tag=...)`: another tag)
def unsigned(tag: str = "x") -> str:
    return f" · unsigned (allowed) · accelerator: none · params: mode=count seconds=0.0 tag={tag}"


UNSIGNED = unsigned()


def outcomes(capsys) -> dict[str, dict]:
    return {o["requirement"]: o for o in json.loads(capsys.readouterr().out)}


def missing(capsys, bus: LocalBus, subject: str, requirement: str) -> list[tuple[str, str, str]]:
    """`gate pr --json` of `requirement` for `subject`: it fails with no evidence (missing, no request);
    returns the results it ignored, each as (request id, kind, reason)."""
    assert gate(bus, subject, requirement, as_json=True) == 1
    o = outcomes(capsys)[requirement]
    assert (o["status"], o["request_id"]) == ("missing", None), o
    return [(i["request_id"], i["kind"], i["reason"]) for i in o["ignored"]]


def set_gate(env: Env, preset: str, value: int) -> None:
    """Change the trusted registry's threshold for `preset` (min /probe/cpu_count)."""
    data = {
        "name": preset,
        **PRESETS[preset],
        "gate": [{"check": "min", "path": "/probe/cpu_count", "value": value}],
    }
    (env.presets / f"{preset}.yaml").write_text(yaml.safe_dump(data))


@pytest.fixture(name="bus")
def bus_fixture(world: Env) -> LocalBus:
    return LocalBus(world)


def test_no_evidence_then_evidence_for_another_commit_then_passing_evidence(
    world: Env, bus: LocalBus, capsys, tmp_path
):
    first = git(world.project, "rev-parse", "HEAD")
    summary = tmp_path / "summary.md"
    summary.write_text("## earlier step\n\nkept\n")
    assert gate(bus, first, "work@cpu", summary=summary) == 1
    out = capsys.readouterr().out
    assert out == f"✗ work@cpu: missing — no trusted, executed work@cpu run on the bus names {first[:12]}\n"
    text = summary.read_text()
    assert text.startswith("## earlier step\n\nkept\n")  # appended, not overwritten
    assert f"**Evidence for `{first}`: ✗ fail** (0 of 1 requirement met)" in text
    assert "| ✗ | `work@cpu` | missing | — | — | `no trusted, executed work@cpu run on the bus names" in text

    rid = bus.run("work", tag="a")
    second = commit(world, "b.txt")
    # the bus has work@cpu evidence, but for the first commit
    assert gate(bus, second, "work@cpu", as_json=True) == 1
    o = outcomes(capsys)["work@cpu"]
    assert o["status"] == "missing" and o["request_id"] is None
    assert o["reasons"] == [
        f"no trusted, executed work@cpu run on the bus names {second[:12]}"
    ]  # its own only

    # the first commit has it: pass (a short rev of this repository is resolved too)
    before = summary.read_text()
    assert gate(bus, first[:10], "work@cpu", "work", summary=summary) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"✓ work@cpu: pass — {rid}{unsigned('a')}", f"✓ work: pass — {rid}{unsigned('a')}"]
    text = summary.read_text()
    assert text.startswith(before)
    added = text[len(before) :]
    assert f"**Evidence for `{first}`: ✓ pass** (2 of 2 requirements met)" in added
    assert (
        f"| ✓ | `work@cpu` | pass | `{rid}` | unsigned (allowed) | 1 check passed — runner r1, done "
        f"{bus.done(rid)[:12]}; accelerator: none; params: mode=count seconds=0.0 tag=a |" in added
    )
    assert "<details>" not in added  # gate sections only for what did not pass


def test_the_newest_evidence_counts_and_a_label_must_match(world: Env, bus: LocalBus, capsys):
    head = git(world.project, "rev-parse", "HEAD")
    passed = bus.run("work", tag="p")
    assert gate(bus, head, "work@cpu", "work@gpu") == 1
    assert capsys.readouterr().out.splitlines() == [
        f"✓ work@cpu: pass — {passed}{unsigned('p')}",
        f"✗ work@gpu: missing — no trusted, executed work@gpu run on the bus names {head[:12]}",
    ]
    failed = new_id("work")  # a request the runner rejects is the newest, but nothing ran: the pass counts
    push_raw_request(
        bus.url, world.project, "cpu", failed, manifest_dict(failed, "work", head, params={"seconds": 999})
    )
    assert bus.runner.once(request_id=failed).status == "rejected"
    assert gate(bus, head, "work@cpu", as_json=True) == 0
    o = outcomes(capsys)["work@cpu"]
    assert (o["status"], o["request_id"]) == ("pass", passed)
    assert [(i["request_id"], i["kind"]) for i in o["ignored"]] == [(failed, "not-run")]
    other = commit(world, "o.txt")  # where the rejected request is all there is, nothing ran: it fails
    rejected = new_id("work")
    push_raw_request(
        bus.url,
        world.project,
        "cpu",
        rejected,
        manifest_dict(rejected, "work", other, params={"seconds": 999}),
    )
    assert bus.runner.once(request_id=rejected).status == "rejected"
    (seen, _, reason), *_ = missing(capsys, bus, other, "work@cpu")
    assert seen == rejected and reason.startswith(
        "rejected: bad parameters: preset work: parameter seconds=999 must be between"
    )
    git(world.project, "checkout", "-q", head)
    again = bus.run("work", tag="again")
    assert gate(bus, head, "work@cpu") == 0
    assert capsys.readouterr().out.splitlines()[0] == f"✓ work@cpu: pass — {again}{unsigned('again')}"


def test_a_failing_report_fails_and_the_runner_verdict_is_not_trusted(
    world: Env, bus: LocalBus, capsys, tmp_path
):
    head = git(world.project, "rev-parse", "HEAD")
    strict = bus.run("strict")  # wants 4096 CPUs: the runner's verdict is fail
    work = bus.run("work")  # the runner's verdict is pass
    summary = tmp_path / "summary.md"
    assert gate(bus, head, "strict@cpu", "work@cpu", summary=summary) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        f"✗ strict@cpu: fail — {strict}: min /probe/cpu_count: /probe/cpu_count = 1, needs ≥ 4096{UNSIGNED}"
    )
    assert out[1] == f"✓ work@cpu: pass — {work}{UNSIGNED}"
    text = summary.read_text()
    assert "(1 of 2 requirements met)" in text
    assert "<details><summary>strict@cpu: fail</summary>" in text and "| ✗ | min | 1 | ≥ 4096 |" in text

    # This machine's registry decides: loosen strict and tighten work, and both verdicts flip.
    set_gate(world, "strict", 1)
    set_gate(world, "work", 64)
    assert gate(bus, head, "strict@cpu", "work@cpu", as_json=True) == 1
    found = outcomes(capsys)
    assert found["strict@cpu"]["status"] == "pass" and found["strict@cpu"]["verdict"]["status"] == "pass"
    assert found["work@cpu"]["status"] == "fail"
    assert found["work@cpu"]["reasons"] == [f"{work}: min /probe/cpu_count: /probe/cpu_count = 1, needs ≥ 64"]
    assert any("gated with this registry's sha256:" in n for n in found["work@cpu"]["notes"])


def test_a_report_edited_after_the_run_does_not_pass(world: Env, bus: LocalBus, capsys):
    head = git(world.project, "rev-parse", "HEAD")
    other = commit(world, "other.txt")
    git(world.project, "checkout", "-q", head)
    rid = bus.run("strict")  # fails: cpu_count 1 < 4096
    prefix = results_path(rid)
    files = bus.files(rid)
    report = json.loads(files["report.json"])
    assert report["subject"] == head

    def edited(**changes) -> dict[str, bytes]:
        data = {**report, "probe": {**report["probe"], "cpu_count": 8192}, **changes}
        return {f"{prefix}/report.json": json.dumps(data).encode()}

    # the checks would pass now, but the report names another commit
    bus.push_done(rid, bus.done(rid), edited(subject=other), replace=True)
    assert gate(bus, head, "strict@cpu", as_json=True) == 1
    o = outcomes(capsys)["strict@cpu"]
    assert o["status"] == "mismatch" and o["verdict"] is None
    assert o["reasons"] == [f"{rid} does not belong to {head[:12]}: its report names subject {other}"]

    # the checks would pass now, but the report no longer fits its schema
    broken = edited(subject=head, unexpected="field")
    bus.push_done(rid, bus.done(rid), broken, replace=True)
    assert gate(bus, head, "strict@cpu", as_json=True) == 1
    o = outcomes(capsys)["strict@cpu"]
    assert o["status"] == "fail" and o["verdict"]["checks"][0]["status"] == "pass"
    assert any(r.startswith(f"{rid}: schema: /: ") and "unexpected" in r for r in o["reasons"]), o["reasons"]

    # a result.json that says the run was on another label
    result = {**json.loads(files["result.json"]), "runner_labels": ["gpu"]}
    bus.push_done(
        rid,
        bus.done(rid),
        {**edited(subject=head), f"{prefix}/result.json": json.dumps(result).encode()},
        replace=True,
    )
    # no evidence: a mismatch is ignored
    assert missing(capsys, bus, head, "strict@cpu") == [
        (
            rid,
            "mismatch",
            f"does not belong to {head[:12]}: it ran on a runner labelled gpu, not cpu",
        )
    ]
    bus.push_done(rid, bus.done(rid), {f"{prefix}/result.json": files["result.json"]}, replace=True)

    # a report that is not strict JSON
    bus.push_done(
        rid, bus.done(rid), {f"{prefix}/report.json": b'{"kind": "probe", "kind": "probe"}'}, replace=True
    )
    assert gate(bus, head, "strict@cpu") == 1
    assert "report.json is not valid: duplicate key 'kind'" in capsys.readouterr().out

    # a good report, but the done commit also changes the code under test
    bus.push_done(
        rid, bus.done(rid), {**edited(subject=head), "work.py": b"print('not what ran')\n"}, replace=True
    )
    assert gate(bus, head, "strict@cpu", as_json=True) == 1
    o = outcomes(capsys)["strict@cpu"]
    assert (o["status"], o["ignored"][0]["reason"]) == (
        "missing",
        f"does not belong to {head[:12]}: its done commit changes the subject's files (work.py)",
    )

    # the same good report alone: now it passes (so each case above failed for its own reason)
    bus.push_done(
        rid,
        bus.done(rid),
        {**edited(subject=head), "work.py": (world.project / "work.py").read_bytes()},
        replace=True,
    )
    assert gate(bus, head, "strict@cpu") == 0
    assert capsys.readouterr().out == f"✓ strict@cpu: pass — {rid}{UNSIGNED}\n"


def test_a_done_commit_pushed_for_another_commit_does_not_count(world: Env, bus: LocalBus, capsys):
    first = git(world.project, "rev-parse", "HEAD")
    rid = bus.run("work")
    second = commit(world, "second.txt")
    files = bus.files(rid)
    # Someone copies the first commit's passing evidence into a new done result that claims the second commit.
    forged = new_id("work")
    result = {**json.loads(files["result.json"]), "subject": second, "request_id": forged}
    report = {**json.loads(files["report.json"]), "subject": second}
    prefix = results_path(forged)
    bus.push_done(
        forged,
        bus.done(rid),
        {
            MANIFEST_PATH: json.dumps(manifest_dict(forged, "work", second)).encode(),
            f"{prefix}/result.json": json.dumps(result).encode(),
            f"{prefix}/report.json": json.dumps(report).encode(),
        },
        replace=False,
    )
    assert missing(capsys, bus, second, "work@cpu") == [
        (
            forged,
            "mismatch",
            f"does not belong to {second[:12]}: its done commit {bus.done(forged)[:12]} "
            f"does not descend from {second[:12]}",
        )
    ]
    # a result.json that names the subject while its request does not
    other = new_id("work")
    bus.push_done(
        other,
        bus.done(rid),
        {f"{results_path(other)}/result.json": json.dumps({**result, "request_id": other}).encode()},
        replace=False,
    )
    assert gate(bus, second, "work@cpu", as_json=True) == 1
    o = outcomes(capsys)["work@cpu"]
    assert o["status"] == "missing" and o["ignored"][0]["request_id"] == other
    assert f"its request names subject {first}, not {second}" in o["ignored"][0]["reason"]
    assert f"its request names id {rid}, not {other}" in o["ignored"][0]["reason"]
    # a request that names the subject and a result.json that does not (nor is readable at all)
    third = new_id("work")
    bus.push_done(
        third,
        bus.done(rid),
        {
            MANIFEST_PATH: json.dumps(manifest_dict(third, "work", second)).encode(),
            f"{results_path(third)}/result.json": b"{}",
        },
        replace=False,
    )
    assert gate(bus, second, "work@cpu", as_json=True) == 1
    o = outcomes(capsys)["work@cpu"]
    assert [i["request_id"] for i in o["ignored"]] == [third, other, forged]
    assert "its result.json is missing or invalid" in o["ignored"][0]["reason"]
    # The newest result that names the first commit (in its request.json) is `other`: it does not verify, so
    # it is ignored, and cannot mask the genuine evidence, which passes for the commit it ran.
    assert gate(bus, first, "work@cpu", as_json=True) == 0
    o = outcomes(capsys)["work@cpu"]
    assert (o["status"], o["request_id"]) == ("pass", rid)
    assert [(i["request_id"], i["kind"]) for i in o["ignored"]] == [(other, "mismatch")]


def test_over_a_url_bus_the_evidence_is_fetched_once(world: Env, capsys):
    bare = G.init_bare(world.tmp / "remote.git")
    bus = LocalBus(world, url=f"file://{bare}")
    head = git(world.project, "rev-parse", "HEAD")
    rid = bus.run("work")
    assert bus.client.bus_dir is None  # not read in place: fetched into the project's object store
    assert not G.present(world.project, [bus.done(rid)])
    assert gate(bus, head, "work@cpu", "cpuonly@cpu") == 1
    assert capsys.readouterr().out.splitlines() == [
        f"✓ work@cpu: pass — {rid}{UNSIGNED}",
        f"✗ cpuonly@cpu: missing — no trusted, executed cpuonly@cpu run on the bus names {head[:12]}",
    ]
    assert not G.present(world.project, [bus.done(rid)])  # beside it, at depth 1: its past is the project's
    assert G.present(world.project / ".git" / RESULTS_STORE, [bus.done(rid)])
    assert not (world.project / ".git" / "shallow").exists()


@pytest.mark.parametrize(
    "checkout,url", [("base", "file"), ("head", "file"), ("base", "path"), ("base", "git"), ("head", "git")]
)
def test_a_depth_1_checkout_fetches_the_runs_down_to_the_subject_never_its_past(
    world: Env, monkeypatch, capsys, checkout: str, url: str, request
):
    """pr-gate.yml checks the base out at depth 1 and gates the PR's head. A done commit's history is its
    heartbeats, claim and request, then the head and the head's whole past: the gate fetches the head at
    depth 1 and the results down to it, never that past (it did: 4 MB for a past of 200 commits of 20 kB,
    benchmarks/bus_scale.py). The same from a depth-1 checkout of the head itself."""
    base = git(world.project, "rev-parse", "HEAD")
    git(world.project, "branch", "base")
    past = []
    for i in range(12):
        (world.project / "big.bin").write_bytes(os.urandom(2048) + str(i).encode())
        git(world.project, "add", "big.bin")
        git(world.project, "commit", "-qm", f"past {i}")
        past.append(git(world.project, "rev-parse", "HEAD"))
    head = past.pop()
    if url == "git":  # over git://, the subject and the runs come in kakeya's own protocol v2 fetch
        daemon = request.getfixturevalue("daemon")
        address, bare = daemon.repo(), daemon.base / "bus.git"
    else:
        bare = G.init_bare(world.tmp / "remote.git")
        address = f"file://{bare}" if url == "file" else str(bare)
    bus = LocalBus(world, url=address)
    rid = bus.run("work")
    ci = world.tmp / "ci"
    branch = "base" if checkout == "base" else "main"
    git(world.tmp, "clone", "-q", "--depth", "1", "--branch", branch, f"file://{world.project}", str(ci))
    assert G.present(ci, [base, head]) == {base if checkout == "base" else head}
    monkeypatch.chdir(ci)
    assert gate(bus, head, "work@cpu") == 0
    assert capsys.readouterr().out.splitlines() == [f"✓ work@cpu: pass — {rid}{UNSIGNED}"]
    stores = Bus(bus.url, ci).repos()
    assert (bare in stores) == (url == "path")  # a bus on a path is read in place: nothing to fetch
    fetched = [repo for repo in stores if repo != bare]
    assert fetched == ([ci] if url == "path" else [ci, ci / ".git" / RESULTS_STORE])
    if url != "path":
        assert any(G.present(repo, [bus.done(rid), head]) == {bus.done(rid), head} for repo in fetched)
    assert not any(G.present(repo, past) for repo in fetched), "the subject's past was fetched"
    assert G.out(ci, "rev-parse", "--is-shallow-repository") == "true"
    assert (ci / ".git" / "shallow").read_text().split() == [base if checkout == "base" else head]
    assert gate(bus, head, "work@cpu") == 0  # again, from what is here
    capsys.readouterr()


def test_bad_requirements_are_refused_before_the_bus_is_read(world: Env, bus: LocalBus, capsys):
    head = git(world.project, "rev-parse", "HEAD")
    assert gate(bus, head, "ghost@cpu") == 2
    assert "unknown preset 'ghost'" in capsys.readouterr().err
    assert gate(bus, head, "strict@gpu") == 2
    assert "preset strict runs on cpu, not gpu" in capsys.readouterr().err
    assert gate(bus, head, "Work@CPU") == 2
    assert "must look like PRESET, PRESET@LABEL or PRESET@LABEL PARAM>=VALUE" in capsys.readouterr().err
    assert gate(bus, "not-a-commit", "work@cpu") == 2
    assert "'not-a-commit' is not a commit" in capsys.readouterr().err
    assert gate(str(world.tmp / "no-such-bus"), head, "work@cpu") == 1
    assert "cannot reach the bus" in capsys.readouterr().err
    at_defaults = (("mode", "count"), ("seconds", 0.0))  # tag: verdict-free
    assert E.check_requirements(["work@cpu", "work@cpu", "work"], load_registry()) == [
        E.Requirement("work", "cpu", defaults=at_defaults),
        E.Requirement("work", defaults=at_defaults),
    ]


def test_the_summary_stays_under_1_mib_with_many_requirements(world: Env, bus: LocalBus, capsys, tmp_path):
    head = git(world.project, "rev-parse", "HEAD")
    bus.run("strict")
    # 20000 requirements, each with a long reason and a failing gate: far more than 1 MiB of markdown
    shelf = E.DoneResults(bus.client.bus).load(["strict"])
    preset = load_registry()["strict"]
    one = E.judge(shelf, head, E.Requirement("strict", "cpu"), preset)
    assert one.status == "fail" and one.verdict is not None
    many = [
        E.Outcome(E.Requirement(f"p{i}", "cpu"), "fail", ["x" * 1000], one.evidence, one.verdict)
        for i in range(20000)
    ]
    text = E.summary_table(head, many)
    size = len(text.encode())
    assert E.SUMMARY_CAP - 2048 < size <= E.SUMMARY_CAP
    assert text.count("\n| ✗ | `p") > 2000 and "<details>" not in text  # rows first; no room for sections
    assert text.rstrip().endswith("`kakeya gate pr --json` has all._")
    cut = int(text.rsplit("summary: ", 1)[1].split(" ")[0])
    assert cut == 20000 - text.count("\n| ✗ | `p") and "20000 gate section(s)" in text
    # sections fill what rows leave
    few = E.summary_table(head, many[:3])
    assert few.count("<details>") == 3 and "Cut to fit" not in few
    part = E.summary_table(head, many[:3], limit=len(few.encode()) - 10)
    shown = part.count("<details>")
    assert len(part.encode()) <= len(few.encode()) - 10 and part.count("\n| ✗ | `p") == 3 and 0 < shown < 3
    assert f"0 more row(s), {3 - shown} gate section(s)" in part
    assert E.summary_table(head, many[:3], limit=100) == ""  # not even the first line fits: nothing

    # through the CLI: appended to a file that is nearly full already, the whole file stays under 1 MiB
    summary = tmp_path / "summary.md"
    summary.write_bytes(b"e" * (E.SUMMARY_CAP - 3000))
    assert gate(bus, head, *[f"{p}@cpu" for p in ("strict", "work", "cpuonly")], summary=summary) == 1
    data = summary.read_bytes()
    assert E.SUMMARY_CAP - 3000 < len(data) < E.SUMMARY_CAP and data.startswith(b"e" * (E.SUMMARY_CAP - 3000))
    assert "`cpuonly@cpu` | missing" in data.decode()
    capsys.readouterr()
    summary.write_bytes(b"e" * E.SUMMARY_CAP)  # full: nothing is appended, and the check still fails
    assert gate(bus, head, "strict@cpu", summary=summary) == 1
    assert summary.stat().st_size == E.SUMMARY_CAP
    assert "already at its 1 MiB limit" in capsys.readouterr().err


def test_a_run_that_did_not_succeed_fails_whatever_its_report(world: Env, capsys):
    """A run that could not start (a variable its preset needs is not set on the runner) ends in an error result."""
    bus = LocalBus(world)
    bus.runner.environ = {k: v for k, v in bus.runner.environ.items() if k != "KAKEYA_TEST_COUNTER"}
    head = git(world.project, "rev-parse", "HEAD")
    rid = bus.run("work")
    assert gate(bus, head, "work@cpu") == 1
    assert capsys.readouterr().out == (
        f"✗ work@cpu: fail — {rid}: the run ended with status error: could not "
        "start: preset work: env COUNTER needs ${ENV:KAKEYA_TEST_COUNTER} but "
        f"KAKEYA_TEST_COUNTER is not set on this runner{UNSIGNED}\n"
    )


def test_a_request_for_the_subject_that_never_ran_there(world: Env, bus: LocalBus, capsys):
    """A request commit whose manifest names the subject but whose parent is another commit is rejected by the
    runner; its done result is the newest that names the subject, and fails."""
    head = git(world.project, "rev-parse", "HEAD")
    other = commit(world, "c.txt")
    rid = new_id("work")
    push_raw_request(bus.url, world.project, "cpu", rid, manifest_dict(rid, "work", head), parent=other)
    assert bus.runner.once(request_id=rid).status == "rejected"
    assert gate(bus, head, "work@cpu") == 1
    assert capsys.readouterr().out.splitlines()[:2] == [
        f"✗ work@cpu: missing — no trusted, executed work@cpu run on the bus names {head[:12]} (1 result(s) "
        "ignored)",
        f"    ignored {rid} (not-run): rejected: invalid manifest: subject {head} is not the request commit's "
        "parent",
    ]


def test_outcomes_in_which_nothing_ran_never_mask_a_run_that_did(world: Env, bus: LocalBus, capsys):
    head = git(world.project, "rev-parse", "HEAD")
    passed = bus.run("work")
    expired, cancelled = bus.not_run()
    rid = new_id("work")
    other = commit(world, "r.txt")
    push_raw_request(bus.url, world.project, "cpu", rid, manifest_dict(rid, "work", head), parent=other)
    assert bus.runner.once(request_id=rid).status == "rejected"
    assert gate(bus, head, "work@cpu", as_json=True) == 0
    outcome = outcomes(capsys)["work@cpu"]
    assert (outcome["status"], outcome["request_id"]) == ("pass", passed)
    assert [(i["request_id"], i["kind"]) for i in outcome["ignored"]] == [
        (rid, "not-run"),
        (cancelled, "not-run"),
        (expired, "not-run"),
    ]
    # a newer run that did run and failed still wins over the older pass
    bus.runner.environ = {k: v for k, v in bus.runner.environ.items() if k != "KAKEYA_TEST_COUNTER"}
    git(world.project, "checkout", "-q", head)
    failed = bus.run("work")
    assert gate(bus, head, "work@cpu", as_json=True) == 1
    assert outcomes(capsys)["work@cpu"]["request_id"] == failed
    # with nothing that ran, there is no evidence: it fails, and says what was ignored
    fresh = commit(world, "s.txt")
    late = bus.client.request("work", {}, "cpu", expires_s=0.001).id
    time.sleep(0.05)
    assert bus.runner.once(request_id=late).status == "expired"
    assert gate(bus, fresh, "work@cpu") == 1
    assert f"    ignored {late} (not-run): expired: expired at " in capsys.readouterr().out


def test_a_requirement_without_pins_counts_only_runs_at_the_presets_defaults(
    world: Env, bus: LocalBus, capsys, tmp_path
):
    """`work@cpu` alone: the run at the preset's defaults is the evidence, a newer one with another `seconds`
    (not verdict-free) is ignored as `pins`, saying so; a different `tag` (verdict-free in the test presets)
    still counts. A pin loosens it (`seconds>=0.01`, `seconds==*`) or tightens it; each row says which
    parameters the run had, in the text, the JSON and the job summary."""
    head = git(world.project, "rev-parse", "HEAD")
    at_default = bus.run("work", tag="d")
    cheaper = bus.run("work", seconds="0.01")  # newer, other parameters
    assert gate(bus, head, "work@cpu", as_json=True) == 0
    o = outcomes(capsys)["work@cpu"]
    assert (o["status"], o["request_id"]) == ("pass", at_default)
    assert o["params"] == {"mode": "count", "tag": "d", "seconds": 0.0}
    assert [(i["request_id"], i["kind"]) for i in o["ignored"]] == [(cheaper, "pins")]
    assert o["ignored"][0]["reason"] == (
        "its parameters do not meet work@cpu: seconds: it ran seconds=0.01, not the preset's default 0.0 "
        "(a pin counts other values: seconds==0.01, seconds==*)"
    )
    # a pin loosens it: the newest run that meets it, whatever its other verdict-free values
    summary = tmp_path / "summary.md"
    assert gate(bus, head, "work@cpu seconds>=0.01", "work@cpu seconds==*", summary=summary) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"✓ work@cpu seconds>=0.01: pass — {cheaper} · unsigned (allowed) · accelerator: none · "
        "params: mode=count seconds=0.01 tag=x",
        f"✓ work@cpu seconds==*: pass — {cheaper} · unsigned (allowed) · accelerator: none · "
        "params: mode=count seconds=0.01 tag=x",
    ]
    assert "params: mode=count seconds=0.01 tag=x |" in summary.read_text()  # the PR comment's table too
    # or tightens it: only a run with that tag
    assert gate(bus, head, "work@cpu tag==e", as_json=True) == 1
    assert outcomes(capsys)["work@cpu tag==e"]["status"] == "missing"
    # with no run at the defaults there is no evidence, and the row says why
    other = commit(world, "c.txt")
    only = bus.run("work", seconds="0.01")
    ((seen, kind, reason),) = missing(capsys, bus, other, "work@cpu")
    assert (seen, kind) == (only, "pins") and "not the preset's default 0.0" in reason
    assert E.Requirement.parse("work@cpu seconds==*", load_registry()).unmet({"seconds": 99}) == [
        "mode: it has no mode (the preset's default: count)"
    ]


def test_the_shipped_presets_mark_device_and_threads_verdict_free():
    registry = load_registry(ROOT / "presets")
    req = E.Requirement.parse("niah-smoke@cpu", registry)
    defaults = registry["niah-smoke"].validate_params({})
    assert not req.unmet(defaults)
    assert not req.unmet({**defaults, "device": "cpu", "threads": 8})  # verdict-free
    assert req.unmet({**defaults, "samples": 1}) == [
        f"samples: it ran samples=1, not the preset's default {defaults['samples']} "
        "(a pin counts other values: samples==1, samples==*)"
    ]
    assert not E.Requirement.parse("niah-smoke@cpu samples>=1", registry).unmet({**defaults, "samples": 1})
    assert {n for n, p in registry.items() if "device" in p.verdict_free} == {
        "niah-ladder", "niah-smoke", "niah-sink-window", "restoration-study", "compression-table",
        "throughput-code"}  # fmt: skip
    assert "device" not in registry["parity"].verdict_free  # cpu vs auto changes what parity compares
    with pytest.raises(InvalidRequest, match=r"\* \(any value\) takes == only"):
        E.Requirement.parse("niah-smoke@cpu samples>=*", registry)


def test_gate_pr_and_evidence_default_the_subject_to_head(world: Env, bus: LocalBus, capsys):
    rid = bus.run("work")
    argv = ["--require", "work@cpu", "--remote", bus.url, "--allow-unsigned"]
    assert main(["gate", "pr", *argv]) == 0
    assert capsys.readouterr().out.startswith(f"✓ work@cpu: pass — {rid}")
    assert main(["evidence", *argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["subject"] == git(world.project, "rev-parse", "HEAD")
    head = commit(world, "n.txt")  # HEAD moved: no evidence for it
    assert main(["gate", "pr", *argv, "--json"]) == 1
    assert outcomes(capsys)["work@cpu"]["reasons"][0].endswith(f"names {head[:12]}")
