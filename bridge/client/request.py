"""What a request is built from, apart from the client that pushes it: the runner labels it may run on, its
subject (a commit, or a snapshot of the working tree), the idempotency key that makes a retry return the
first request (`Idempotency`, one ref a key under `IDEM_PREFIX`), and the bus's layout marker.

    labels = runner_labels("h200,h100")                         # each valid, each once, in order
    subject = working_subject(root, None, allow_dirty=False, who=who)   # HEAD when only untracked files differ
    first = earlier_request(bus, "k-1", preset, request_content(bus, preset, values, labels, sha, None))
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from bridge.bus.bus import Bus
from bridge.bus.records import LAYOUT, LAYOUT_KAKEYA, NS, Manifest, _File, parse_or_none, read_manifests
from bridge.client.rows import shown
from bridge.core.errors import BusError, InvalidRequest
from bridge.core.names import check_label
from bridge.wire import git

if TYPE_CHECKING:
    from bridge.presets.preset import Preset

IDEM_PREFIX = NS + "idem/"  # refs/kakeya/idem/<sha256 of the key>: the request a key made
IDEM_PATH = ".kakeya/idempotency.json"


def idem_ref(key_sha256: str) -> str:
    return f"{IDEM_PREFIX}{key_sha256}"


class Idempotency(_File):
    """.kakeya/idempotency.json, on a child of the request commit that `idem_ref` points at: the request a key
    made and the runner labels it was asked for (the rest of its content is its request.json)."""

    schema_version: Literal[1] = 1
    key_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    labels: list[str] = Field(min_length=1, max_length=32)
    id: str

    @staticmethod
    def key_hash(key: str) -> str:
        if not key or len(key) > 200 or any(unicodedata.category(c) in ("Cc", "Cf") for c in key):
            raise InvalidRequest(
                f"idempotency key {key[:40]!r} must be 1 to 200 printable characters (e.g. a UUID)"
            )
        return hashlib.sha256(key.encode()).hexdigest()


def runner_labels(spec: str | Sequence[str]) -> list[str]:
    """'h200,h100' (or a list) -> the labels in order, each valid and given once."""
    labels = [lb.strip() for lb in spec.split(",")] if isinstance(spec, str) else [lb.strip() for lb in spec]
    if not labels or len(set(labels)) != len(labels):
        raise InvalidRequest(
            f"--runner {','.join(labels)!r} must name each runner label once, e.g. h200,h100"
        )
    return [check_label(lb) for lb in labels]


@dataclass
class LabelChoice:
    """Which of several runner labels a request took: the first with a live runner (`live`), else the first."""

    labels: list[str]
    chosen: str
    live: bool


@dataclass
class Subject:
    """What a request runs: the commit `sha`; `snapshot_of`: the HEAD a snapshot of the working tree was made
    on; `unsent`: untracked files a runner will not see (the tree was otherwise clean, HEAD was sent)."""

    sha: str
    snapshot_of: str | None = None
    unsent: list[str] = field(default_factory=list)


def rev_parse(root: Path, rev: str) -> str:
    sha = git.rev_parse(root, rev)
    if sha is None:
        raise InvalidRequest(f"{rev!r} is not a commit in {root}")
    return sha


def dirty_paths(root: Path, untracked: bool = True) -> list[str]:
    return [p for p in git.dirty_paths(root, untracked) if not p.startswith(".kakeya/")]


def working_subject(root: Path, rev: str | None, allow_dirty: bool, who: str) -> Subject:
    """REV; or HEAD when the tree is clean (untracked files only: HEAD, the files listed in `unsent`); or with
    `allow_dirty`, a snapshot of the working tree on HEAD. Changes to tracked files without `allow_dirty`:
    InvalidRequest (`dirty-tree`)."""
    if rev:
        if allow_dirty:
            raise InvalidRequest(
                "--allow-dirty snapshots the working tree on HEAD; it cannot go with --subject"
            )
        return Subject(rev_parse(root, rev))
    head = rev_parse(root, "HEAD")
    dirty = dirty_paths(root)
    if not dirty:
        return Subject(head)
    if allow_dirty:
        return Subject(snapshot(root, head, who), snapshot_of=head)
    # only changes to tracked files block: untracked ones (results/, notes) are only said
    tracked = dirty_paths(root, untracked=False)
    if not tracked:
        return Subject(head, unsent=dirty)
    raise InvalidRequest(
        f"the working tree has uncommitted changes ({shown(tracked)}): a runner would not see them. "
        "Commit them, or pass --allow-dirty to send a snapshot of the working tree",
        code="dirty-tree",
        hint="commit the changes, or pass --allow-dirty",
    )


def snapshot(root: Path, head: str, who: str) -> str:
    """A commit of the working tree (tracked and untracked, minus ignored) on HEAD: the user's branch,
    index and files stay as they are."""
    tree = git.working_tree(root)
    return git.commit(root, tree, [head], f"kakeya: snapshot of the working tree on {head[:12]}", who)


def request_content(
    bus: Bus,
    preset: Preset,
    values: Mapping[str, Any],
    labels: Sequence[str],
    subject: str,
    snapshot_of: str | None,
) -> str:
    """What an idempotent retry must match, hashed: the preset, its typed parameters, the runner labels in
    order and the subject (a snapshot of a dirty tree: its files, not the new commit each one makes)."""
    seen = subject
    if snapshot_of:
        tree = git.out(git.repo_having(bus.repos(), subject), "rev-parse", subject + "^{tree}")
        seen = f"snapshot of {snapshot_of}: tree {tree}"
    content = {"preset": preset.name, "params": dict(values), "labels": list(labels), "subject": seen}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def earlier_request(bus: Bus, given: str, preset: Preset, content: str) -> Manifest | None:
    """The request made earlier with the key `given` (its one ref, `idem_ref`), or None when there is none.
    Its content is read from its own request.json, never taken on trust from the key's file: InvalidRequest
    when it differs from `content`, BusError when the key's ref names no request."""
    key = Idempotency.key_hash(given)
    ref = idem_ref(key)
    sha = bus.ls_remote(ref).refs.get(ref)
    if sha is None:
        return None
    bus.fetch_ids([sha], "the idempotency key's request")
    spec = f"{sha}:{IDEM_PATH}"
    first = parse_or_none(Idempotency, git.read_blobs_in(bus.repos(), [spec]).get(spec))
    manifest = read_manifests(bus.repos(), [sha]).get(sha)
    if (
        first is None
        or first.key_sha256 != key
        or not isinstance(manifest, Manifest)
        or manifest.id != first.id
        or manifest.runner not in first.labels
    ):
        raise BusError(f"the idempotency key's ref {ref} on the bus is not a request's; delete it")
    try:
        same = manifest.preset == preset.name and content == request_content(
            bus,
            preset,
            preset.validate_params(manifest.params),
            first.labels,
            manifest.subject,
            manifest.snapshot_of,
        )
    except InvalidRequest:  # parameters this registry does not take: not the same request
        same = False
    if not same:
        raise InvalidRequest(
            f"idempotency key {given!r} was used for request {first.id} with other content (preset, "
            "parameters, runner labels or subject differ); use a new key for a new request"
        )
    return manifest


def layout_marker(bus: Bus) -> str:
    """The commit the layout marker ref (`layout_ref`) points at: a root commit that says the layout."""
    text = f"kakeya bus layout {LAYOUT} (kakeya >= {LAYOUT_KAKEYA[LAYOUT]})\n"
    tree = git.tree_with(bus.store, None, {".kakeya/layout.txt": text.encode()})
    return git.commit(bus.store, tree, [], text, "kakeya <kakeya@kakeya.invalid>")
