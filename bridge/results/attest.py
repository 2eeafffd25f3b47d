"""Evidence other tools can verify: an in-toto Statement v1 about a run, in a DSSE envelope signed with the
runner's SSH key (the key that signs its done commits), checked offline against an allowed-signers file.

The runner writes it at done time (`write`, next to result.json, so that it is committed in the signed done
commit); `kakeya results ID --attestation [FILE]` hands it out and `kakeya verify FILE` checks it (`verify`):

    envelope = sign(statement(out, label="h200", principal="gpu-1@h200"), key)   # the runner, at done time
    checked = verify(envelope_bytes, Signers.load(allowed), files=out_dir)       # anyone, offline
    checked.principal, checked.statement.subject                                  # "gpu-1@h200", [...]

The signature is `ssh-keygen -Y sign -n git` over DSSE's pre-authentication encoding (PAE) of the payload.
The namespace is git's: the runners' allowed-signers lines already limit their keys to it, and a PAE (which
starts with `DSSEv1 `) can never be taken for a git object, nor a git object's signature for a PAE's.
docs/evidence.md maps the statement to SLSA provenance.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

import gates
from bridge.bus.trust import PRINCIPAL_RE, Signers
from bridge.core.errors import KakeyaError
from bridge.core.result import RunResult

FILE = "attestation.json"  # in a run's results, next to result.json
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
PREDICATE_TYPE = "https://kakeya.invalid/attestation/run/v1"
NAMESPACE = "git"
SUBJECT = "subject"  # the name of the subject commit's entry
DIGESTED = ("report.json", "result.json", "verdict.json")  # the run's files the statement names, when present
MAX_BYTES = 4 * 1024 * 1024


class AttestationError(KakeyaError):
    """An attestation that does not verify: what is wrong with it, for a person."""


class Subject(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    digest: dict[str, str]


class Runner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None
    label: str | None  # the runner label the request asked for
    labels: list[str]
    principal: str  # the allowed-signers principal it signs as


class Predicate(BaseModel):
    """The run: its record (result.json as committed), the preset definition's hash, the runner and device."""

    model_config = ConfigDict(extra="forbid")
    request_id: str | None
    preset: str
    preset_hash: str | None
    params: dict[str, Any]
    status: str
    verdict: str | None
    runner: Runner
    device: dict[str, Any]  # the host's accelerator (result.json's host.accelerator) and the report's device
    run: dict[str, Any]  # result.json


class Statement(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    type_: Literal["https://in-toto.io/Statement/v1"] = Field(STATEMENT_TYPE, alias="_type")
    subject: list[Subject] = Field(min_length=1)
    predicateType: Literal["https://kakeya.invalid/attestation/run/v1"] = PREDICATE_TYPE  # noqa: N815
    predicate: Predicate

    def digests(self) -> dict[str, dict[str, str]]:
        return {s.name: s.digest for s in self.subject}


class Signature(BaseModel):
    model_config = ConfigDict(extra="forbid")
    keyid: str = ""
    sig: str  # base64 of the SSHSIG blob (`ssh-keygen -Y sign`, unarmoured)


class Envelope(BaseModel):
    """A DSSE envelope (https://github.com/secure-systems-lab/dsse)."""

    model_config = ConfigDict(extra="forbid")
    payloadType: str  # noqa: N815
    payload: str  # base64
    signatures: list[Signature] = Field(min_length=1)


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what is signed."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def statement(out: Path, label: str | None, principal: str) -> Statement:
    """The statement about the run whose files are in `out` (written: result.json, report.json, ...)."""
    raw = json.loads((out / "result.json").read_text())
    result = RunResult.model_validate(raw)
    if not result.subject:
        raise KakeyaError("no attestation for a run without a subject commit")
    subjects = [Subject(name=SUBJECT, digest={"gitCommit": result.subject})]
    subjects += [
        Subject(name=name, digest={"sha256": sha256_file(out / name)})
        for name in DIGESTED
        if (out / name).is_file()
    ]
    device: dict[str, Any] = {"accelerator": result.host.get("accelerator")}
    try:
        env = gates.parse_report((out / "report.json").read_bytes(), "report.json").get("environment")
        if isinstance(env, dict) and isinstance(env.get("device"), str):
            device["report"] = env["device"]
    except (OSError, gates.ReportError):
        pass
    predicate = Predicate(
        request_id=result.request_id,
        preset=result.preset,
        preset_hash=result.preset_hash,
        params=result.params,
        status=result.status,
        verdict=result.verdict,
        runner=Runner(name=result.runner_name, label=label, labels=result.runner_labels, principal=principal),
        device=device,
        run=raw,
    )
    return Statement(subject=subjects, predicate=predicate)


def _ssh_keygen(*args: str, data: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(["ssh-keygen", *args], input=data, capture_output=True, timeout=60, check=False)
    except FileNotFoundError:
        raise KakeyaError("ssh-keygen is not installed (OpenSSH 8.2 or later signs and verifies)") from None


def _armour(blob: bytes) -> bytes:
    b64 = base64.b64encode(blob).decode()
    lines = [b64[i : i + 70] for i in range(0, len(b64), 70)]
    return ("-----BEGIN SSH SIGNATURE-----\n" + "\n".join(lines) + "\n-----END SSH SIGNATURE-----\n").encode()


def sign(st: Statement, key: str) -> Envelope:
    """`st` in a DSSE envelope signed with the SSH key file `key` (`ssh-keygen -Y sign`)."""
    payload = st.model_dump_json(by_alias=True).encode()
    with tempfile.TemporaryDirectory(prefix="kakeya-attest-") as tmp:
        msg = Path(tmp) / "pae"
        msg.write_bytes(pae(PAYLOAD_TYPE, payload))
        done = _ssh_keygen("-Y", "sign", "-q", "-f", key, "-n", NAMESPACE, str(msg))
        if done.returncode != 0:
            raise KakeyaError(f"could not sign the attestation with {key}: {done.stderr.decode().strip()}")
        armoured = (Path(tmp) / "pae.sig").read_text()
    blob = base64.b64decode("".join(line for line in armoured.splitlines() if not line.startswith("-----")))
    return Envelope(
        payloadType=PAYLOAD_TYPE,
        payload=base64.b64encode(payload).decode(),
        signatures=[Signature(keyid=st.predicate.runner.principal, sig=base64.b64encode(blob).decode())],
    )


def write(out: Path, key: str | None, label: str | None, principal: str) -> Path | None:
    """The runner's attestation of the run in `out`, written there as FILE when it signs (`key`); any FILE the
    program left there is removed first (only the runner writes one). None when not signing."""
    (out / FILE).unlink(missing_ok=True)
    if key is None or not (out / "result.json").is_file():
        return None
    try:
        st = statement(out, label, principal)
    except KakeyaError:
        return None  # nothing to attest: the run had no subject commit
    (out / FILE).write_text(sign(st, key).model_dump_json(indent=2) + "\n")
    return out / FILE


def hand_out(out: Path, dest: Path | None) -> Path:
    """The attestation in a run's fetched results `out`, copied to `dest` when given; where it is."""
    src = out / FILE
    if not src.is_file():
        raise KakeyaError(
            f"{out.name} has no attestation: its runner did not sign it (no signing key), the run ended "
            "before it had a result, or an older runner ran it"
        )
    if dest is None:
        return src
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(src.read_bytes())
    return dest.resolve()


class Verified(BaseModel):
    principal: str
    statement: Statement
    checked_files: list[str] = []  # the files whose sha256 was compared with the statement's


def _parse(data: bytes) -> tuple[Envelope, bytes]:
    if len(data) > MAX_BYTES:
        raise AttestationError(f"not an attestation: {len(data)} bytes (at most {MAX_BYTES})")
    try:
        env = Envelope.model_validate_json(data)
    except ValidationError as exc:
        raise AttestationError(f"not a DSSE envelope: {exc.errors()[0]['msg']}") from None
    if env.payloadType != PAYLOAD_TYPE:
        raise AttestationError(
            f"payload type {env.payloadType!r} is not an in-toto statement ({PAYLOAD_TYPE})"
        )
    try:
        return env, base64.b64decode(env.payload, validate=True)
    except ValueError:
        raise AttestationError("the envelope's payload is not base64") from None


def _signer(env: Envelope, payload: bytes, signers: Signers) -> str:
    """The principal of `signers` whose key made one of the envelope's signatures over the PAE."""
    message = pae(env.payloadType, payload)
    problems = []
    with tempfile.TemporaryDirectory(prefix="kakeya-verify-") as tmp:
        for i, s in enumerate(env.signatures):
            sig = Path(tmp) / f"{i}.sig"
            try:
                sig.write_bytes(_armour(base64.b64decode(s.sig, validate=True)))
            except ValueError:
                problems.append(f"signature {i + 1} is not base64")
                continue
            found = _ssh_keygen("-Y", "find-principals", "-s", str(sig), "-f", str(signers.path))
            names = found.stdout.decode().split() if found.returncode == 0 else []
            if not names:
                problems.append(
                    f"wrong signer: signature {i + 1} was made by a key that is not in {signers.path.name}"
                )
                continue
            for name in names:
                check = _ssh_keygen(
                    "-Y", "verify", "-f", str(signers.path), "-I", name, "-n", NAMESPACE, "-s", str(sig),
                    data=message,
                )  # fmt: skip
                if check.returncode == 0:
                    return name
            problems.append(
                f"bad signature: signature {i + 1} (key of {', '.join(names)}) does not match the payload "
                "(it was changed after signing)"
            )
    raise AttestationError("; ".join(problems))


def verify(data: bytes, signers: Signers, files: Path | None = None) -> Verified:
    """The attestation `data` checked offline: a DSSE envelope whose signature over the payload is by a key of
    `signers`, whose principal may serve the run's label, holding a Kakeya in-toto statement; with `files`
    (a run's results directory), each file the statement names has the sha256 it says. AttestationError
    says what failed."""
    env, payload = _parse(data)
    principal = _signer(env, payload, signers)
    try:
        st = Statement.model_validate_json(payload)
    except ValidationError as exc:
        e = exc.errors()[0]
        where = "/".join(str(p) for p in e["loc"])
        raise AttestationError(f"not a Kakeya in-toto statement: {where}: {e['msg']}") from None
    runner = st.predicate.runner
    m = PRINCIPAL_RE.match(principal)
    served = set(m.group(2).split("+")) if m else set()
    if m is None or runner.name != m.group(1):  # the runner's key, whatever labels its line allows
        raise AttestationError(
            f"wrong signer: the statement is about runner {runner.name}, but {principal} signed it"
        )
    if runner.label is not None and runner.label not in served:
        raise AttestationError(
            f"key not allowed for this label: {principal} may serve {', '.join(sorted(served)) or 'no label'}, "
            f"not {runner.label}"
        )
    digests = st.digests()
    if digests.get(SUBJECT, {}).get("gitCommit") != st.predicate.run.get("subject"):
        raise AttestationError("the statement's subject commit is not the run's subject")
    checked = []
    for name, digest in digests.items() if files is not None else ():
        if name == SUBJECT:
            continue
        path = files / name  # type: ignore[operator]
        if not path.is_file():
            raise AttestationError(f"{name} is named by the statement but missing from {files}")
        got = sha256_file(path)
        if got != digest.get("sha256"):
            raise AttestationError(
                f"digest mismatch: {path} has sha256 {got}, the statement says {digest.get('sha256')}"
            )
        checked.append(name)
    return Verified(principal=principal, statement=st, checked_files=checked)
