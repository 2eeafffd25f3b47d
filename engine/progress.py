"""A workload's own progress, for whoever runs it: when KAKEYA_PROGRESS names a file (a Kakeya runner sets
it), `report_progress` writes `{"done": 3, "total": 5, "what": "rung 3 of 5"}` there atomically; otherwise
it does nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path


def report_progress(done: int, total: int, what: str = "") -> None:
    path = os.environ.get("KAKEYA_PROGRESS")
    if not path:
        return
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    try:
        tmp.write_text(json.dumps({"done": done, "total": total, "what": what[:200]}))
        os.replace(tmp, target)
    except OSError:
        pass  # progress is a courtesy: it never fails a workload
