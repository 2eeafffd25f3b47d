"""Signed evidence and signed requests, with real SSH keys (`ssh-keygen`), real `git verify-commit`, a real
`git daemon` bus: a runner signs its claim and done commits; `kakeya gate pr` and `kakeya results --verify`
accept only the runner's signed done commit itself, and each forgery fails with its own reason."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bridge.bus.bus import Bus
from bridge.bus.records import done_ref, req_ref, results_path
from bridge.bus.trust import ALLOWED_SIGNERS, Signers, principal, signers_line
from bridge.cli.main import main
from bridge.config import load_config
from bridge.core.errors import InvalidRequest
from bridge.run.isolation import bwrap_available
from bridge.run.runner import Runner
from bridge.wire import git as G
from tests.bridge.bus_support import Daemon, Env, git, move_done
from tests.bridge.test_gate_pr import LocalBus, commit, gate, missing


def keygen(path: Path) -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)], check=True
    )
    return path


def allow(path: Path, *signers: tuple[str, Path]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [signers_line(name, key.with_suffix(".pub").read_text()) for name, key in signers]
    path.write_text("# kakeya runners\n" + "\n".join(lines) + "\n")
    return path


@pytest.fixture(name="keys")
def keys_fixture(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "keys").mkdir()
    return {n: keygen(tmp_path / "keys" / n) for n in ("r1", "r2", "stranger", "alice")}


def signed_runner(env: Env, url: str, name: str, labels: tuple[str, ...], key: Path, **config) -> Runner:
    """A runner signing with `key`; labels whose hardware this host lacks (gpu) are forced. It runs in the
    bubblewrap sandbox (a runner refuses to sign where runs could read its key): the test program's counter
    is then out of a run's reach, its stdout says what ran."""
    if not bwrap_available():
        pytest.skip(
            "a signing runner needs a sandbox: bubblewrap (apt-get install bubblewrap) is not usable here"
        )
    cfg = load_config().model_copy(update={"signing_key": str(key), "isolation": "bwrap", **config})
    return Runner(
        url,
        config=cfg,
        name=name,
        labels=list(labels),
        workdir=env.tmp / "runners" / name,
        force_labels=True,
    )


def test_signed_evidence_passes_and_every_forgery_fails_for_its_own_reason(
    world: Env, daemon: Daemon, keys: dict[str, Path], capsys
):
    # The trusted base names r1 (cpu and gpu) and r2 (gpu only); the stranger's key is nowhere.
    allow(
        world.project / ALLOWED_SIGNERS,
        (principal("r1", ["cpu", "gpu"]), keys["r1"]),
        (principal("r2", ["gpu"]), keys["r2"]),
    )
    git(world.project, "add", "-A")
    git(world.project, "commit", "-qm", "allowed signers")
    first = git(world.project, "rev-parse", "HEAD")
    bus = LocalBus(world, url=daemon.repo())
    bus.runner = signed_runner(world, bus.url, "r1", ("cpu",), keys["r1"])
    rid = bus.run("work", tag="a")
    done = bus.done(rid)
    signers = world.project / ALLOWED_SIGNERS
    # the claim and the done commit are signed: git itself says so
    Bus(bus.url, world.project).fetch([done_ref(rid)])
    for sha in (done, G.parents(world.project, done)[0]):
        ok, code, who, _ = G.verify_commit(world.project, sha, signers)
        assert (ok, code, who) == (True, "G", "r1@cpu+gpu")
    signed = f"✓ work@cpu: pass — {rid} · signed by r1@cpu+gpu · accelerator: none · params: mode=count seconds=0.0 tag=a\n"
    assert gate(bus, first, "work@cpu") == 0
    assert capsys.readouterr().out == signed
    out = world.tmp / "res"
    assert main(["results", rid, "--verify", "--remote", bus.url, "--out", str(out)]) == 0
    assert json.loads((out / rid / "result.json").read_text())["status"] == "succeeded"
    assert capsys.readouterr().out.startswith(f"{rid}: signed by r1@cpu+gpu\n")
    # the run's own page says whom the runner signed as
    assert "<td>signed</td><td>signed by r1@cpu</td>" in (out / rid / "report.html").read_text()

    def judged(subject: str, request_id: str, kind: str) -> str:
        """The reason of the one result work@cpu ignored for `subject` (left with no evidence): that
        request's, set aside as `kind`."""
        ((seen, seen_kind, reason),) = missing(capsys, bus, subject, "work@cpu")
        assert (seen, seen_kind) == (request_id, kind), reason
        return reason

    # 1. A report edited after the run: one more commit on the done ref (the checks would still pass).
    prefix = results_path(rid)
    report = json.loads(bus.files(rid)["report.json"])
    edited = {
        f"{prefix}/report.json": json.dumps({**report, "probe": {**report["probe"], "cpu_count": 2}}).encode()
    }
    bus.push_done(rid, done, edited, replace=True)
    assert judged(first, rid, "untrusted") == (
        f"edited after the run: the done ref is {bus.done(rid)[:12]}, not runner r1@cpu+gpu's signed "
        f"commit {done[:12]} (commits were added or rewritten after it)"
    )
    assert main(["results", rid, "--verify", "--remote", bus.url, "--out", str(out)]) == 1
    assert "its results are not trusted: edited after the run" in capsys.readouterr().err
    # ... or the done commit rewritten in place on the runner's signed claim: the same refusal
    bus.push_done(rid, G.parents(world.project, done)[0], edited, replace=True)
    assert judged(first, rid, "untrusted").startswith("edited after the run: ")
    move_done(bus.url, world.project, rid, done)
    assert gate(bus, first, "work@cpu") == 0
    capsys.readouterr()

    # 2. A done ref for a request no runner ran: a request for the next commit and a done commit on it.
    second = commit(world, "second.txt")
    result = json.loads(bus.files(rid)["result.json"])

    def forge(sign_key: Path | None, label: str = "cpu", preset: str = "work") -> str:
        fid = bus.client.request(preset, {}, label).id
        Bus(bus.url, world.project).fetch([req_ref(label, fid)])
        req = Bus(bus.url, world.project).ls_remote(req_ref(label, fid)).refs[req_ref(label, fid)]
        files = {
            f"{results_path(fid)}/result.json": json.dumps(
                {**result, "subject": second, "request_id": fid, "preset": preset, "runner_labels": [label]}
            ).encode(),
            f"{results_path(fid)}/report.json": json.dumps({**report, "subject": second}).encode(),
        }
        sha = G.child_commit(
            world.project, req, files, "forged", "Mallory <m@x>", str(sign_key) if sign_key else None
        )
        move_done(bus.url, world.project, fid, sha, (second,))
        return fid

    never = forge(None)
    assert judged(second, never, "untrusted") == (
        f"unsigned: done commit {bus.done(never)[:12]} has no signature and no runner signed a commit "
        "for this request"
    )
    move_done(bus.url, world.project, never, None)

    # 3. A done commit signed by a key that is not in the allowed signers.
    unknown = forge(keys["stranger"])
    reason = judged(second, unknown, "untrusted")
    assert reason.startswith(f"unknown key: done commit {bus.done(unknown)[:12]} is signed by SHA256:")
    assert reason.endswith(f"which is not in {Path(ALLOWED_SIGNERS).name}")
    move_done(bus.url, world.project, unknown, None)

    # 4. A runner key signing for a label it may not serve: r2 (gpu only) really runs a cpu request.
    rogue = signed_runner(world, bus.url, "r2", ("cpu",), keys["r2"])
    cpu_run = bus.client.request("work", {"tag": "b"}, "cpu").id
    served = rogue.once(request_id=cpu_run)
    assert served is not None and served.pushed and served.status == "succeeded"
    assert judged(second, cpu_run, "untrusted") == (
        f"key not allowed for this label: {bus.done(cpu_run)[:12]} is signed by r2@gpu, which may "
        "serve gpu, not cpu"
    )
    move_done(bus.url, world.project, cpu_run, None)

    # 5. A replayed done commit: the runner's signed pass for the first commit, as the done ref of a request
    #    for the second commit.
    replay = bus.client.request("work", {}, "cpu").id
    move_done(bus.url, world.project, replay, done, (second,))
    reason = judged(second, replay, "mismatch")
    assert reason.startswith(f"does not belong to {second[:12]}: its request names subject {first}, not ")
    assert f"request mismatch: done commit {done[:12]} was not made on the request commit" in reason
    assert main(["results", replay, "--verify", "--remote", bus.url, "--out", str(out)]) == 1
    assert "request mismatch" in capsys.readouterr().err

    # each refusal above was its own: with the replay gone, the genuine signed run passes for the commit it ran
    move_done(bus.url, world.project, replay, None)
    assert gate(bus, first, "work@cpu") == 0
    assert capsys.readouterr().out == signed


def test_signed_requests_only_run_when_a_requester_signed_them(
    world: Env, daemon: Daemon, keys: dict[str, Path], monkeypatch: pytest.MonkeyPatch
):
    requesters = allow(world.tmp / "requesters", ("alice@example.com", keys["alice"]))
    bus = LocalBus(world, url=daemon.repo())
    runner = signed_runner(
        world,
        bus.url,
        "r1",
        ("cpu",),
        keys["r1"],
        require_signed_requests=True,
        allowed_requesters=str(requesters),
    )
    head = git(world.project, "rev-parse", "HEAD")
    # unsigned, then signed by a key the runner does not know: rejected, nothing runs
    for key, why in (
        (None, "unsigned: the request commit"),
        (keys["stranger"], "unknown key: the request commit"),
    ):
        if key:
            monkeypatch.setenv("KAKEYA_SIGNING_KEY", str(key))
        rid = bus.client.__class__(load_config(), remote=bus.url).request("work", {"tag": "x"}, "cpu").id
        served = runner.once(request_id=rid)
        assert served is not None and served.pushed and served.status == "rejected"
        assert served.reason is not None and served.reason.startswith(why)
        assert f"requires requests signed by a key of {requesters}" in served.reason
        files = bus.files(rid)
        assert json.loads(files["result.json"])["status"] == "rejected" and "logs/stdout.log" not in files
    # signed by alice: it runs
    monkeypatch.setenv("KAKEYA_SIGNING_KEY", str(keys["alice"]))
    rid = bus.client.__class__(load_config(), remote=bus.url).request("work", {"tag": "ok"}, "cpu").id
    served = runner.once(request_id=rid)
    assert served is not None and served.status == "succeeded"
    assert bus.files(rid)["logs/stdout.log"] == b"work count ok done\n"
    assert json.loads(bus.files(rid)["result.json"])["subject"] == head


def test_allowed_signers_files_are_checked_and_keys_must_exist(
    tmp_path: Path, keys: dict[str, Path], world: Env
):
    bad = tmp_path / "bad"
    bad.write_text(signers_line("just-a-name", keys["r1"].with_suffix(".pub").read_text()) + "\n")
    with pytest.raises(InvalidRequest, match=r"bad:1: principal 'just-a-name' must be RUNNER@LABEL"):
        Signers.load(bad)
    assert Signers.load(bad, runners=False).labels == {"just-a-name": frozenset()}
    (tmp_path / "empty").write_text("# nobody\n")
    with pytest.raises(InvalidRequest, match="names nobody"):
        Signers.load(tmp_path / "empty")
    (tmp_path / "garbage").write_text("r1@cpu\n")
    with pytest.raises(InvalidRequest, match=r"garbage:1: expected 'PRINCIPAL \[OPTIONS\] KEYTYPE KEY'"):
        Signers.load(tmp_path / "garbage")
    with pytest.raises(InvalidRequest, match="is not an SSH public key"):
        signers_line("r1@cpu", "hello")
    with pytest.raises(InvalidRequest, match="signing key .*/nope does not exist"):
        signed_runner(world, str(G.init_bare(tmp_path / "b.git")), "r1", ("cpu",), tmp_path / "nope")
    # a key git cannot sign with: the message names the key and the setting
    (tmp_path / "notakey").write_text("not a key\n")
    runner = signed_runner(world, str(G.init_bare(tmp_path / "c.git")), "r1", ("cpu",), tmp_path / "notakey")
    with pytest.raises(
        Exception, match=r"cannot sign with the SSH key .*notakey \(signing_key / KAKEYA_SIGNING_KEY\)"
    ):
        G.commit(
            runner.mirror, G.tree_with(runner.mirror, None, {"a": b"a"}), [], "m", "a <a@b>", runner.sign_key
        )


def test_doctor_prints_the_runners_allowed_signers_line(
    world: Env, keys: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys
):
    bare = str(G.init_bare(world.tmp / "bus.git"))
    main(["doctor", "--remote", bare])
    assert "ok    signing  no signing_key: results and requests are unsigned" in capsys.readouterr().out
    monkeypatch.setenv("KAKEYA_SIGNING_KEY", str(keys["r1"]))
    main(["doctor", "--remote", bare])
    line = signers_line("inproc@cpu", keys["r1"].with_suffix(".pub").read_text())
    assert (
        f"ok    signing  signs with {keys['r1']}; its allowed-signers line: {line}" in capsys.readouterr().out
    )
    monkeypatch.setenv("KAKEYA_SIGNING_KEY", str(world.tmp / "missing"))
    main(["doctor", "--remote", bare])
    assert "FAIL  signing  signing key" in capsys.readouterr().out
