"""A preset's `baseline: {from: previous-pass, ...}`: a run's report compared with the previous pass on the
bus (`apply_baseline`, the runner's; `compare_to_previous`, also `kakeya gate pr`'s)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import gates
import gates.tables
from bridge.bus import trust
from bridge.bus.bus import Bus
from bridge.config import project_root
from bridge.core.errors import KakeyaError
from bridge.evidence.done import DoneResults, regate
from bridge.presets.preset import Preset
from bridge.results.outcome import RunOutcome


def compare_to_previous(
    dones: DoneResults,
    preset: Preset,
    label: str | None,
    request_id: str | None,
    report: dict[str, Any],
    params: dict[str, Any] | None = None,
) -> tuple[gates.Baseline, gates.Comparison | None]:
    """The preset's baseline comparison for `report` (the run `request_id`); dones loaded with the preset."""
    spec = preset.baseline
    assert spec is not None
    where = f"{preset.name} on {label or 'any runner'}"
    found = dones.previous_pass(preset, label, before=request_id, params=params)
    if found is None:
        return gates.Baseline(
            source=spec.from_,
            note=f"no previous pass of {where} with these parameters; nothing to compare with",
        ), None
    done, base = found
    subject = done.result.subject if done.result else None
    baseline = gates.Baseline(
        source=spec.from_,
        run=done.id,
        subject=subject,
        note=f"previous pass {done.id} (subject {(subject or 'unknown')[:12]})",
    )
    # The metric and tolerance were validated with the preset, so compare raises nothing here.
    return baseline, gates.compare(
        report,
        base,
        spec.metric,
        spec.max_regression_pct,
        higher_is_better=spec.higher_is_better,
        samples=spec.samples,
    )


def gate_for_label(preset: Preset, label: str | None, outcome: RunOutcome) -> RunOutcome:
    """The run's verdict with the preset's checks for runner label `label` (`gate_on`), as `kakeya gate pr`
    gates it; a preset without them, or a run without a verdict, is returned as it is."""
    if not preset.gate_on.get(label or "") or outcome.verdict is None or outcome.report is None:
        return outcome
    verdict = regate(outcome.report, preset, label)
    return replace(
        outcome, result=outcome.result.model_copy(update={"verdict": verdict.status}), verdict=verdict
    )


def apply_baseline(bus: Bus, preset: Preset, label: str | None, outcome: RunOutcome) -> RunOutcome:
    """After the runner gated a run: gate it for its runner label (`gate_for_label`), then compare its report
    with the previous pass on the bus, record the comparison in the verdict, and fail the verdict on a
    regression (in memory; the outcome is written once, afterwards). A preset without `baseline:` or a run
    without a verdict is not compared. The bus being unreachable is recorded, never raised: a run is not
    lost for want of its baseline."""
    outcome = gate_for_label(preset, label, outcome)
    result = outcome.result
    if preset.baseline is None or outcome.verdict is None or outcome.report is None:
        return outcome
    try:  # the runner's trusted checkout names the runners whose passes may be a baseline
        dones = DoneResults(bus, trust.trusted_signers(project_root())).load([preset.name])
        baseline, comparison = compare_to_previous(
            dones, preset, label, result.request_id, outcome.report, result.params
        )
    except KakeyaError as exc:
        baseline, comparison = gates.Baseline(source=preset.baseline.from_, note=f"not compared: {exc}"), None
    verdict = outcome.verdict.with_comparison(baseline, comparison)
    update: dict[str, Any] = {"verdict": verdict.status}
    if (
        verdict.status == "fail"
        and comparison is not None
        and comparison.status == "fail"
        and not result.reason
    ):
        update["reason"] = f"regression: {comparison.reason}"
    return replace(outcome, result=result.model_copy(update=update), verdict=verdict)
