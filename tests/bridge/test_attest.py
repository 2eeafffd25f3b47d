"""The runner's in-toto attestation of a run (bridge/results/attest.py): a real signed runner writes it in its done
commit, `kakeya results --attestation` hands it out, `kakeya verify` checks it offline with ssh-keygen; a
tampered payload, a stranger's key, another allowed runner's key and a swapped file each fail for their own
reason, and a file the program planted under the runner's name is never handed out as the runner's."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

from bridge.bus.trust import ALLOWED_SIGNERS, principal
from bridge.cli.main import main
from bridge.results import attest
from tests.bridge.bus_support import Daemon, Env
from tests.bridge.test_gate_pr import LocalBus
from tests.bridge.test_signing import allow, keys_fixture, signed_runner  # noqa: F401 (the `keys` fixture)


def test_a_signed_runs_attestation_verifies_offline_and_every_forgery_fails(
    world: Env, daemon: Daemon, keys: dict[str, Path], capsys
):
    signers = allow(
        world.tmp / "allowed",
        (principal("r1", ["cpu", "gpu"]), keys["r1"]),
        (principal("r2", ["gpu"]), keys["r2"]),
    )
    bus = LocalBus(world, url=daemon.repo())
    bus.runner = signed_runner(world, bus.url, "r1", ("cpu",), keys["r1"])
    rid = bus.run("work", tag="a")
    done = bus.done(rid)
    assert "attestation.json" in bus.files(rid)  # committed in the runner's signed done commit

    out, dest = world.tmp / "res", world.tmp / "evidence" / "att.json"
    assert main(["results", rid, "--remote", bus.url, "--out", str(out), "--attestation", str(dest)]) == 0
    out = out / rid  # --out DIR writes DIR/<id>
    assert f"attestation: {dest}" in capsys.readouterr().out
    envelope = json.loads(dest.read_text())
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    statement = json.loads(base64.b64decode(envelope["payload"]))
    subject = json.loads((out / "result.json").read_text())["subject"]
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == attest.PREDICATE_TYPE
    digests = {s["name"]: s["digest"] for s in statement["subject"]}
    assert digests["subject"] == {"gitCommit": subject}
    for name in ("report.json", "result.json", "verdict.json"):
        assert digests[name] == {"sha256": attest.sha256_file(out / name)}
    p = statement["predicate"]
    assert (p["request_id"], p["preset"], p["status"], p["verdict"]) == (rid, "work", "succeeded", "pass")
    assert p["runner"] == {"name": "r1", "label": "cpu", "labels": ["cpu"], "principal": "r1@cpu"}
    assert p["preset_hash"].startswith("sha256:") and p["run"]["request_id"] == rid

    # 1. It verifies offline: the files next to it (the fetched results) match their digests.
    assert main(["verify", str(out / "attestation.json"), "--allowed-signers", str(signers)]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"{out / 'attestation.json'}: verified: signed by r1@cpu+gpu; work ({rid}) on ")
    assert "files match their digests: report.json, result.json, verdict.json" in said
    # ... and the allowed signers of the checkout (as `gate pr` uses) are the default
    (world.project / ALLOWED_SIGNERS).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(signers, world.project / ALLOWED_SIGNERS)
    assert main(["verify", str(dest), "--files", str(out)]) == 0
    assert "files match their digests" in capsys.readouterr().out
    assert main(["verify", str(dest), "--files", str(out), "--json"]) == 0  # for agents: one object
    said = json.loads(capsys.readouterr().out)
    assert (said["principal"], said["request_id"], said["checked_files"]) == (
        "r1@cpu+gpu",
        rid,
        ["report.json", "result.json", "verdict.json"],
    )
    assert (
        main(["verify", str(dest)]) == 0
    )  # alone, away from the results: the signature only, and it says so
    assert "files not compared (no results folder; --files DIR)" in capsys.readouterr().out
    assert main(["verify", str(dest), "--allowed-signers", str(world.tmp / "none")]) == 2
    assert "no allowed-signers file" in capsys.readouterr().err

    def refused(data: bytes | str, files: Path | None = None) -> str:
        forged = world.tmp / "forged.json"
        forged.write_bytes(data if isinstance(data, bytes) else data.encode())
        args = ["verify", str(forged), "--allowed-signers", str(signers)]
        assert main(args + (["--files", str(files)] if files else [])) == 1
        return capsys.readouterr().err.strip()

    # 2. A tampered payload (the verdict turned to pass, the signature kept)
    tampered = {**statement, "predicate": {**p, "verdict": "fail"}}
    env2 = {**envelope, "payload": base64.b64encode(json.dumps(tampered).encode()).decode()}
    assert refused(json.dumps(env2)) == (
        "kakeya: error: bad signature: signature 1 (key of r1@cpu+gpu) does not match the payload (it was "
        "changed after signing)"
    )
    # 3. The same statement signed by a key that is not allowed, and by another allowed runner's key
    st = attest.Statement.model_validate(statement)
    stranger = attest.sign(st, str(keys["stranger"])).model_dump_json()
    assert refused(stranger) == (
        "kakeya: error: wrong signer: signature 1 was made by a key that is not in allowed"
    )
    assert refused(attest.sign(st, str(keys["r2"])).model_dump_json()) == (
        "kakeya: error: wrong signer: the statement is about runner r1, but r2@gpu signed it"
    )
    other = st.model_copy(
        update={
            "predicate": st.predicate.model_copy(
                update={"runner": st.predicate.runner.model_copy(update={"name": "r2"})}
            )
        }
    )
    assert refused(attest.sign(other, str(keys["r2"])).model_dump_json()) == (
        "kakeya: error: key not allowed for this label: r2@gpu may serve gpu, not cpu"
    )
    # 4. A swapped file: another report.json in the results folder than the one the runner signed
    swapped = world.tmp / "swapped"
    shutil.copytree(out, swapped)
    (swapped / "report.json").write_text(
        (out / "report.json").read_text().replace('"cpu_count": 1', '"cpu_count": 9')
    )
    why = refused(dest.read_bytes(), swapped)
    assert why.startswith(f"kakeya: error: digest mismatch: {swapped / 'report.json'} has sha256 ")
    assert why.endswith(f"the statement says {digests['report.json']['sha256']}")
    # ... and not an envelope at all
    assert refused(b"[]").startswith("kakeya: error: not a DSSE envelope")
    assert done == bus.done(rid)


def test_an_attestation_the_program_planted_is_never_the_runners(tmp_path: Path, capsys):
    out = tmp_path / "r-1"
    out.mkdir()
    (out / "attestation.json").write_text('{"planted": true}')
    assert attest.write(out, None, "cpu", "r1@cpu") is None  # an unsigned runner: the planted file is gone
    assert not (out / "attestation.json").exists()
    try:
        attest.hand_out(out, None)
    except attest.KakeyaError as exc:
        assert "r-1 has no attestation: its runner did not sign it" in str(exc)
    else:
        raise AssertionError("an unsigned run handed out an attestation")
