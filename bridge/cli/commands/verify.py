"""`kakeya verify FILE [--allowed-signers F] [--files DIR]`: check a run's attestation offline (bridge/results/attest.py).

The DSSE envelope's signature must be by a key of the allowed signers (default: .github/kakeya-allowed-signers
of this checkout, as `kakeya gate pr` uses), whose principal may serve the run's label; the payload must be
a Kakeya in-toto statement. The files it names (report.json, result.json, verdict.json) are compared with
their sha256 in DIR, by default the folder FILE is in when it holds result.json. Exit 0 verified, 1 not
(the line says why), 2 unusable input (no allowed-signers file, no FILE). docs/evidence.md.
--json: one `verify` object (principal, preset, request_id, subject, status, verdict, checked_files)."""

from __future__ import annotations

import argparse
from pathlib import Path

from bridge.bus.trust import ALLOWED_SIGNERS, Signers
from bridge.cli.commands._common import add_json, config_and_root, emit
from bridge.core.errors import InvalidRequest
from bridge.results import attest


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("verify", help="check a run's signed attestation offline")
    parser.add_argument("file", type=Path, help="the attestation (`kakeya results ID --attestation FILE`)")
    parser.add_argument(
        "--allowed-signers",
        type=Path,
        metavar="F",
        help=f"the allowed-signers file (default {ALLOWED_SIGNERS})",
    )
    parser.add_argument(
        "--files",
        type=Path,
        metavar="DIR",
        help="compare the files the statement names with these (default: FILE's folder, if it holds result.json)",
    )
    add_json(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    path = args.allowed_signers
    if path is None:
        _, root = config_and_root()
        path = root / ALLOWED_SIGNERS
    if not path.is_file():
        raise InvalidRequest(f"no allowed-signers file {path}: pass --allowed-signers F")
    try:
        data = args.file.read_bytes()
    except OSError as exc:
        raise InvalidRequest(f"cannot read {args.file}: {exc.strerror or exc}") from None
    files = args.files
    if files is None and (args.file.parent / "result.json").is_file():
        files = args.file.parent
    checked = attest.verify(data, Signers.load(path), files)
    p = checked.statement.predicate
    subject = checked.statement.digests()[attest.SUBJECT]["gitCommit"]
    if args.json:
        emit(
            {
                "event": "verify",
                "file": str(args.file),
                "verified": True,
                "principal": checked.principal,
                "preset": p.preset,
                "request_id": p.request_id,
                "subject": subject,
                "status": p.status,
                "verdict": p.verdict,
                "checked_files": list(checked.checked_files),
                "files": str(files) if checked.checked_files else None,
            }
        )
        return 0
    print(
        f"{args.file}: verified: signed by {checked.principal}; {p.preset} ({p.request_id}) on subject "
        f"{subject}: {p.status}" + (f", verdict {p.verdict}" if p.verdict else "")
    )
    if checked.checked_files:
        print(f"files match their digests: {', '.join(checked.checked_files)} in {files}")
    else:
        print("files not compared (no results folder; --files DIR)")
    return 0
