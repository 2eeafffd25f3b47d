"""The geometry sweep at a larger budget (issue 44): per family, how many configs were drawn, how many
transformers itself cannot build or generate with (skipped), how many the engine decodes exactly, refuses
at load in one line, or breaks on; and `fixed`: the exact ones that are broken without issue 44's fixes
(each fix switched off in turn, `FIXES`). Writes JSON.

    python -m benchmarks.geometry_sweep --budget 30 --out benchmarks/results/geometry_sweep.json

The draws and their checks are tests/engine/geometry_sweep.py's (seeded: a draw is a function of family,
seed and index); every non-exact outcome is listed with its fields, its run and its one-line reason.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks import harness
from tests.engine import geometry_sweep

# Issue 44's fixes, as (module, function) the sweep can switch off to see what each one fixed.
FIXES = {"mla_one_kv_group": ("engine.backends.torch.session", "_one_kv_group")}


@contextlib.contextmanager
def without(fix: str) -> Iterator[None]:
    module = importlib.import_module(FIXES[fix][0])
    name = FIXES[fix][1]
    kept = getattr(module, name)
    setattr(module, name, lambda *a, **k: None)
    try:
        yield
    finally:
        setattr(module, name, kept)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", help="default: all")
    parser.add_argument("--budget", type=int, default=30, help="draws per family")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/geometry_sweep.json"))
    parser.add_argument("--mlx", action="store_true", help="also decode each torch-exact draw on mlx")
    args = parser.parse_args(argv)
    families = args.families or list(geometry_sweep.FAMILIES)
    t0 = time.monotonic()
    load_before = harness.load_average()
    outcomes = geometry_sweep.sweep(families, args.budget, args.seed, log=sys.stderr, mlx=args.mlx)
    fixed: dict[str, str] = {}
    for o in outcomes:
        if o.status != "exact":
            continue
        for fix in FIXES:
            with without(fix):
                if geometry_sweep.check(o.family, args.seed, o.index).status == "broken":
                    fixed[o.id] = fix
    per_family: dict[str, dict[str, Any]] = {}
    for f in families:
        mine = [o for o in outcomes if o.family == f]
        counts = {s: sum(o.status == s for o in mine) for s in ("skipped", "exact", "refused", "broken")}
        per_family[f] = {"drawn": len(mine), **counts, "fixed": sum(o.id in fixed for o in mine)}
        if args.mlx:  # of the torch-exact draws: on mlx, exact / refused at load / broken
            on_mlx = [str(o.extra.get("mlx", "")) for o in mine if o.status == "exact"]
            per_family[f]["mlx"] = {
                s: sum(m.startswith(s) for m in on_mlx) for s in ("exact", "refused", "broken")
            }
            # refused by issue 44's mlx checks (each a crash at load or at the first forward before, or
            # for Qwen3.5 with no linear layer other tokens than generate: tests/engine/test_geometry_sweep.py)
            per_family[f]["mlx"]["refused_by_new_checks"] = sum(
                m.startswith("refused") and ("is not supported: " in m or "'weights'" in m) for m in on_mlx
            )
    totals = {
        k: sum(v[k] for v in per_family.values())
        for k in ("drawn", "skipped", "exact", "refused", "broken", "fixed")
    }
    report = {
        "command": harness.command("geometry_sweep", argv),
        "budget": args.budget,
        "seed": args.seed,
        "seconds": round(time.monotonic() - t0, 1),
        "totals": totals,
        "families": per_family,
        "not_exact": [
            {"id": o.id, "status": o.status, "run": o.run, "fields": o.fields, "detail": o.detail}
            for o in outcomes
            if o.status != "exact"
        ],
        "mlx_not_exact": [
            {"id": o.id, "mlx": o.extra["mlx"], "fields": o.fields}
            for o in outcomes
            if str(o.extra.get("mlx", "exact")) != "exact"
        ],
        "fixed": [
            {"id": i, "fix": fix, "fields": next(o.fields for o in outcomes if o.id == i)}
            for i, fix in fixed.items()
        ],
    }
    report["environment"] = harness.environment(load_before)
    harness.write_json(args.out, report, indent=1, default=str)
    print(json.dumps({"totals": totals, "families": per_family}, indent=1))
    mlx_broken = sum(v.get("mlx", {}).get("broken", 0) for v in per_family.values())
    return 1 if totals["broken"] or mlx_broken else 0


if __name__ == "__main__":
    sys.exit(main())
