"""Evidence on the bus: the run that proves a commit (for `kakeya gate pr`) and the previous pass (for a
preset's `baseline: {from: previous-pass, ...}`).

    dones = DoneResults(bus, signers)        # signers: the trusted base's allowed signers (None: unsigned allowed)
    dones.load(["probe"], subject=sha)       # one prefix-scoped listing, one fetch by id, one batch read
    req = Requirement.parse("niah-ladder@h200 samples>=5", registry)   # typed pins, checked once
    outcome = judge(dones, subject, req, registry["niah-ladder"])
    outcome.status, outcome.trust, outcome.ignored   # pass | fail | missing | mismatch; "signed by r1@h200"; ...
    dones.previous_pass(preset, "cpu", before=request_id)   # (done result, report) or None

Nothing a runner or a requester wrote is taken on trust. The evidence is the newest done result that names
the subject (in its request or its result) and is a trusted, executed run of the requirement: the runner's
signed done commit for its label (when `dones` has signers), a run that ran (not expired, cancelled or
rejected), agreeing everywhere — request.json, result.json and report.json name the subject, the done commit
descends from it, was made on its request commit and changes nothing outside .kakeya/, it ran this
registry's preset definition (when signed) — with parameters that meet the requirement's pins (a parameter without a pin: the preset's default, unless
the preset marks it `verdict_free`). Its report is
gated again with the checks of this machine's preset registry for the label it ran on (`gate` and
`gate_on`); the runner's verdict is ignored. Every newer result that names the subject but is no such run is
listed as ignored, with why (`Ignored`): none of them can mask the evidence.

By concern: requirements.py (what is required), done.py (the done results read from the bus),
baseline.py (the previous pass), judge.py (judging a requirement), summary.py (the job summary),
service.py (the evidence a commit needs, for the front ends: `kakeya evidence`, `gate pr`, the MCP server).
"""

from bridge.evidence.baseline import apply_baseline, compare_to_previous, gate_for_label
from bridge.evidence.done import BATCH, Done, DoneResults, regate
from bridge.evidence.judge import Ignored, Outcome, evidence_json, gate_subject, judge, judged_runs
from bridge.evidence.requirements import REQUIRED_FILE, Pin, Requirement, check_requirements, parse_required
from bridge.evidence.summary import SUMMARY_CAP, append_summary, summary_table

__all__ = [
    "BATCH",
    "Done",
    "DoneResults",
    "Ignored",
    "Outcome",
    "Pin",
    "REQUIRED_FILE",
    "Requirement",
    "SUMMARY_CAP",
    "append_summary",
    "apply_baseline",
    "check_requirements",
    "compare_to_previous",
    "evidence_json",
    "gate_for_label",
    "gate_subject",
    "judge",
    "judged_runs",
    "parse_required",
    "regate",
    "summary_table",
]
