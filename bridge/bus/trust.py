"""Who may sign what: allowed-signers files (git's own format) and what a signed commit proves.

A runner signs its claim and done commits with its SSH key (`signing_key`). Evidence counts only as the
runner's signed done commit itself, checked with `git verify-commit` against the allowed-signers file of
the trusted base (ALLOWED_SIGNERS), whose principals name the runner and the labels it may serve:

    gpu-box-1@h200+cpu namespaces="git" ssh-ed25519 AAAAC3Nza...      # runner gpu-box-1 serves h200 and cpu

A runner may also require signed requests (`require_signed_requests`), checked against its own
allowed-requesters file (the same format; the principal is any name, labels are not used).

    signers = Signers.load(Path(".github/kakeya-allowed-signers"))
    signed_done(repo, done_sha, stop=subject, label="h200", signers=signers)   # ("gpu-box-1@h200+cpu", None): trusted

Without the file, evidence on a shared bus is refused (`evidence_signers`) unless unsigned evidence is
explicitly allowed (`--allow-unsigned`); the embedded bus needs no keys.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from bridge.bus.records import Manifest, read_manifests
from bridge.core.errors import InvalidRequest
from bridge.core.names import LABEL
from bridge.wire import git

ALLOWED_SIGNERS = ".github/kakeya-allowed-signers"
PRINCIPAL_RE = re.compile(rf"^([A-Za-z0-9][A-Za-z0-9._-]*)@({LABEL}(?:\+{LABEL})*)$")
EDIT_DEPTH = 8  # commits looked at below a done commit that is not signed, for an edited signed one
_KEY_TYPES = ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-", "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-")


def key_file(path: str) -> str | None:
    """The SSH signing key file `path` (resolved), or None for '' (sign nothing); it must exist."""
    if not path:
        return None
    key = Path(path).expanduser().resolve()
    if not key.is_file():
        raise InvalidRequest(f"signing key {key} does not exist (signing_key / KAKEYA_SIGNING_KEY)")
    return str(key)


def principal(runner: str, labels: list[str]) -> str:
    """The allowed-signers principal of a runner: `NAME@LABEL+LABEL`."""
    return f"{runner}@{'+'.join(labels)}"


def signers_line(name: str, public_key: str) -> str:
    """The allowed-signers line for `name` (a principal) and a public key ('TYPE BASE64 [comment]')."""
    parts = public_key.split()
    if len(parts) < 2 or not parts[0].startswith(_KEY_TYPES):
        raise InvalidRequest(f"{public_key[:40]!r}... is not an SSH public key ('ssh-ed25519 AAAA...')")
    return f'{name} namespaces="git" {parts[0]} {parts[1]}'


@dataclass(frozen=True)
class Signers:
    """An allowed-signers file: principal -> the runner labels it may serve (empty for a requester)."""

    path: Path
    labels: dict[str, frozenset[str]]

    @classmethod
    def load(cls, path: Path, runners: bool = True) -> Signers:
        """Parse and check `path`; with `runners`, every principal must be `NAME@LABEL+LABEL`."""
        try:
            text = path.read_text()
        except OSError as exc:
            raise InvalidRequest(f"allowed-signers file {path}: {exc.strerror or exc}") from None
        labels: dict[str, frozenset[str]] = {}
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            fields = line.split()
            key_at = next((i for i, f in enumerate(fields) if f.startswith(_KEY_TYPES)), None)
            if key_at is None or key_at == 0 or key_at + 1 >= len(fields):
                raise InvalidRequest(
                    f"{path}:{n}: expected 'PRINCIPAL [OPTIONS] KEYTYPE KEY', e.g. "
                    "'gpu-1@h200+cpu namespaces=\"git\" ssh-ed25519 AAAA...'"
                )
            for name in fields[0].split(","):
                m = PRINCIPAL_RE.match(name)
                if runners and not m:
                    raise InvalidRequest(
                        f"{path}:{n}: principal {name!r} must be RUNNER@LABEL[+LABEL...], e.g. gpu-1@h200+cpu"
                    )
                labels[name] = frozenset(m.group(2).split("+")) if m else frozenset()
        if not labels:
            raise InvalidRequest(f"allowed-signers file {path} names nobody")
        return cls(path, labels)


def signature_problem(repo: Path | str, sha: str, signers: Signers, what: str) -> str | None:
    """Why commit `sha` is not signed by a principal of `signers` (None: it is); `what` names it."""
    ok, code, _, key = git.verify_commit(repo, sha, signers.path)
    if ok:
        return None
    if code == "N":
        return f"unsigned: {what} {sha[:12]} has no signature"
    if code == "B":
        return f"bad signature: {what} {sha[:12]} does not match its signature"
    return (
        f"unknown key: {what} {sha[:12]} is signed by {key or 'a key'}, which is not in {signers.path.name}"
    )


def signed_done(
    repo: Path | str, done: str, stop: str | None, label: str | None, signers: Signers
) -> tuple[str | None, str | None]:
    """(principal, None) when `done` is a runner's signed done commit for runner label `label`, signed by that
    principal; (None, why not) otherwise. `stop` is the subject: commits below it are not looked at when
    telling an edit after the run from an unsigned forgery."""
    ok, code, who, key = git.verify_commit(repo, done, signers.path)
    if ok:
        served = signers.labels.get(who, frozenset())
        if label is not None and label not in served:
            return None, (
                f"key not allowed for this label: {done[:12]} is signed by {who}, which may serve "
                f"{', '.join(sorted(served)) or 'no label'}, not {label}"
            )
        return who, None
    # A few commits down is enough to tell an edit on top of the runner's signed commit (it only changes
    # the reason, never the refusal), and keeps a long forged chain from costing a verify per commit.
    for older in git.first_parents(repo, done, stop, limit=EDIT_DEPTH)[1:] if stop else []:
        good, _, runner, _ = git.verify_commit(repo, older, signers.path)
        if good:
            return None, (
                f"edited after the run: the done ref is {done[:12]}, not runner {runner}'s signed commit "
                f"{older[:12]} (commits were added or rewritten after it)"
            )
    if code == "N":
        why = f"unsigned: done commit {done[:12]} has no signature and no runner signed a commit for this request"
    elif code == "B":
        why = f"bad signature: done commit {done[:12]} does not match its signature"
    else:
        why = f"unknown key: done commit {done[:12]} is signed by {key or 'a key'}, which is not in {signers.path.name}"
    return None, why


def done_signer(
    repo: Path | str, request_id: str, done: str, req: str | None, label: str | None, signers: Signers
) -> tuple[str | None, str | None]:
    """(the principal that signed it, None) when done commit `done` is evidence of request `request_id` (its
    request commit `req`, on runner label `label`); (None, why not): not the runner's signed commit, or not
    made on that request."""
    manifest = found if isinstance(found := read_manifests([repo], [done])[done], Manifest) else None
    label = label or (manifest.runner if manifest else None)
    who, problem = signed_done(repo, done, manifest.subject if manifest else None, label, signers)
    problem = problem or request_problem(repo, request_id, done, req)
    return (None, problem) if problem else (who, None)


def done_problem(
    repo: Path | str, request_id: str, done: str, req: str | None, label: str | None, signers: Signers
) -> str | None:
    """Why done commit `done` is not evidence of request `request_id` (None: it is); see `done_signer`."""
    return done_signer(repo, request_id, done, req, label, signers)[1]


def request_problem(repo: Path | str, request_id: str, done: str, req: str | None) -> str | None:
    """Why `done` was not made on the request commit `req` of `request_id` (None: it was, or no req ref)."""
    if req is not None and not git.is_ancestor(repo, req, done):
        return (
            f"request mismatch: done commit {done[:12]} was not made on the request commit {req[:12]} of "
            f"{request_id} (a done commit replayed from another request)"
        )
    return None


def trusted_signers(root: Path, path: Path | None = None) -> Signers | None:
    """The allowed signers of the trusted base: `path`, else <root>/ALLOWED_SIGNERS when it exists, else None
    (no file: see `evidence_signers`, which decides whether unsigned evidence may count)."""
    if path is not None:
        return Signers.load(path)
    default = root / ALLOWED_SIGNERS
    return Signers.load(default) if default.is_file() else None


UNSIGNED = "unsigned (allowed)"  # what a row says of evidence that was not (and need not be) signed


def evidence_signers(
    root: Path, path: Path | None, *, bus: str, embedded: bool, allow_unsigned: bool
) -> Signers | None:
    """Who must have signed the evidence on `bus`: the trusted base's allowed signers (`trusted_signers`).
    Without a file, evidence counts unsigned only on the embedded bus (`embedded`: nobody else can write it)
    or when the caller said so (`allow_unsigned`); on a shared bus anyone with push access could forge it,
    so InvalidRequest gives the steps to add the file."""
    signers = trusted_signers(root, path)
    if signers is not None or embedded or allow_unsigned:
        return signers
    raise InvalidRequest(
        f"no allowed-signers file ({root / ALLOWED_SIGNERS}): evidence on the shared bus {bus} must be signed "
        "by a runner, or anyone with push access could forge it. To add one: (1) on each runner make a key, "
        "`ssh-keygen -t ed25519 -N '' -f ~/.config/kakeya/signing-key` (scripts/setup-runner.sh does this), "
        'and set `signing_key = "~/.config/kakeya/signing-key"` in its kakeya.toml (or KAKEYA_SIGNING_KEY); '
        f"(2) add its line to {ALLOWED_SIGNERS} on the trusted base branch, "
        '`RUNNER@LABEL[+LABEL...] namespaces="git" ssh-ed25519 AAAA...` (`kakeya doctor` on the runner prints '
        "it); (3) request the runs again, so that signed runners serve them. Or pass --allow-unsigned to "
        "accept unsigned evidence (docs/runners.md, Trust)"
    )


def trust_words(signer: str | None) -> str:
    """What a row says of its evidence: `signed by RUNNER@LABELS`, or `unsigned (allowed)`."""
    return f"signed by {signer}" if signer else UNSIGNED
