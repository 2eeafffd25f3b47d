"""The judged plots: each results table that declares plots (gates/tables.py) drawn after the gate, with the
gate's threshold lines, and the verdict, preset, runner label, subject and device in the title; axes in human
units (KiB/MiB, tok/s, ×), never 2×10^5. Written next to summary.md as results-N.png by RunOutcome.write.

    pngs = judged_plots(tables, title)    # {"results-1.png": b"\x89PNG..."}; {} without matplotlib
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import gates.tables
from gates.checks import threshold_text
from gates.report import is_number

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


def _plain(text: str, limit: int = 120) -> str:
    """A report's text for a plot: no mathtext (`$`), one line, at most `limit` characters."""
    text = text.replace("$", r"\$").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def title_line(
    preset: str, verdict: str | None, label: str | None, subject: str | None, device: str | None
) -> str:
    """What a judged plot's title says: `niah-smoke · verdict pass · cpu · subject 9bde92932dc1 · cpu (x86_64)`."""
    parts = [preset, f"verdict {verdict or 'none'}", f"label {label or 'none'}"]
    parts += [f"subject {(subject or 'unknown')[:12]}", f"device {device or 'unknown'}"]
    return " · ".join(parts)


def _formatter(unit: gates.tables.Unit) -> Any:
    """Tick labels in human units; plain numbers without an exponent or offset."""
    from matplotlib.ticker import FuncFormatter, ScalarFormatter

    if unit:
        return FuncFormatter(
            lambda v, _pos: gates.tables.human(int(v) if float(v).is_integer() else float(v), unit)
        )
    plain = ScalarFormatter(useOffset=False)
    plain.set_scientific(False)
    return plain


def _panel(
    ax: Any, table: gates.tables.Built, plot: gates.tables.Plot, threshold: float | None = None
) -> None:
    (xcol, xs), *_ = table.series(plot.x) or [(None, [])]
    ys = [s for name in plot.y for s in table.series(name)]
    groups = [table.series(name)[0][1] for name in plot.series if table.series(name)]
    keys = list(dict.fromkeys(zip(*groups, strict=True))) if groups else [()]
    categorical = any(not is_number(x) for x in xs)
    positions = list(range(len(xs))) if categorical else xs
    n = 0
    for col, values in ys:
        for key in keys:
            pts = [
                (p, v)
                for i, (p, v) in enumerate(zip(positions, values, strict=True))
                if is_number(v) and (not key or tuple(g[i] for g in groups) == key)
            ]
            if not pts:
                continue
            label = _plain(col.name + (f" ({', '.join(str(k) for k in key)})" if key else ""), 60)
            color = COLORS[n % len(COLORS)]
            if categorical:
                width = 0.8 / max(1, len(ys))
                ax.bar([p + n * width for p, _ in pts], [v for _, v in pts], width, label=label, color=color)
            else:  # each line thinner than the one before, with smaller markers: equal series stay visible
                ax.plot(
                    [p for p, _ in pts],
                    [v for _, v in pts],
                    "-o",
                    label=label,
                    color=color,
                    lw=max(1.0, 4.0 - 1.2 * n),
                    ms=max(3.0, 10.0 - 2.5 * n),
                    mfc="none" if n == 0 else color,
                    mew=1.5,
                    zorder=2 + n,
                )
            n += 1
    drawn = set()
    for col, _ in ys:
        for check in col.checks:
            if check.check not in ("min", "max", "between"):
                continue
            for t in check.value if check.check == "between" else [check.value]:
                if (t, check.check) not in drawn:
                    drawn.add((t, check.check))
                    ax.axhline(
                        t,
                        color="black",
                        ls="--",
                        lw=1.2,
                        label=f"gate: {_plain(col.name, 40)} {threshold_text(check.check, check.value)}",
                    )
    if threshold is not None and plot.threshold:
        what = f"gate: {_plain(plot.threshold_label or plot.threshold, 60)} ({threshold:g})"
        ax.axhline(threshold, color="black", ls="--", lw=1.2, label=what)
        drawn.add((threshold, "min"))
    if categorical:
        ax.set_xticks(positions, [_plain(str(x), 20) for x in xs], rotation=30, ha="right", fontsize=8)
    elif xs:
        if plot.log_x and all(x > 0 for x in xs):
            ax.set_xscale("log", base=2)
        distinct = sorted(set(xs))
        if len(distinct) <= 12:
            ax.set_xticks(distinct)
        ax.minorticks_off()
        ax.xaxis.set_major_formatter(_formatter(xcol.unit if xcol else ""))
    unit = ys[0][0].unit if ys else ""
    if plot.log_y and all(v > 0 for _, vals in ys for v in vals if is_number(v)):
        ax.set_yscale("log", base=2 if unit == "bytes" else 10)
        ax.minorticks_off()
    ax.yaxis.set_major_formatter(_formatter(unit))
    ax.set_xlabel(_plain(plot.xlabel or plot.x, 40))
    ax.set_ylabel(_plain(plot.ylabel + (f" ({unit})" if unit == "bytes" else ""), 60))
    ax.grid(alpha=0.3)
    if n or drawn:
        ax.legend(fontsize=7)


def judged_plots(tables: Sequence[gates.tables.Built], title: str) -> dict[str, bytes]:
    """A PNG per table that declares plots (one panel each), named results-N.png; {} when matplotlib is not
    installed (a client-only install: the tables still show every value)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    out: dict[str, bytes] = {}
    for table in (t for t in tables if t.plots):
        fig, axes = plt.subplots(
            1, len(table.plots), figsize=(max(7.5, 5.2 * len(table.plots)), 4.6), squeeze=False
        )
        for ax, plot, threshold in zip(axes[0], table.plots, table.thresholds, strict=True):
            _panel(ax, table, plot, threshold)
        fig.suptitle(f"{_plain(title, 160)}\n{_plain(table.title)}", fontsize=9)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90)
        plt.close(fig)
        out[f"results-{len(out) + 1}.png"] = buf.getvalue()
    return out
