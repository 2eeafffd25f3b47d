"""Workload plots: where a report's PNG goes, drawing it next to the report, and a headless pyplot."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.report import write_report


def plot_path(out: str, suffix: str, given: str | None) -> Path | None:
    """Where a workload's PNG goes: --plot PATH, 'none' for no plot, default `<report stem>-SUFFIX.png`
    next to the report (the run dir when a runner runs it, so summary.md embeds it)."""
    if given == "none":
        return None
    if given:
        return Path(given)
    report = Path(out)
    return report.with_name(f"{report.stem}-{suffix}.png")


def write_plotted(
    out: str,
    kind: str,
    body: dict[str, Any],
    draw: Callable[[dict[str, Any], Path], None],
    suffix: str,
    given: str | None,
) -> tuple[dict[str, Any], Path | None]:
    """Draw the body's plot where `plot_path` says (naming it in the body as `plot`), then write the
    report (schema version 1); returns the report and the PNG path (None: no plot)."""
    png = plot_path(out, suffix, given)
    if png is not None:
        draw(body, png)
        body["plot"] = png.name
    return write_report(out, kind, 1, body), png


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (imported here: only plotting workloads need it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
