"""Result files: every benchmark table is written once as CSV and once as JSON, side by side."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def write_rows(
    rows: Sequence[dict[str, Any]],
    stem: Path,
    *,
    fields: Sequence[str] | None = None,
    payload: Any = None,
) -> None:
    """Write ``rows`` to ``<stem>.csv`` and ``payload`` (default: the rows) to ``<stem>.json``.

    ``fields`` fixes the CSV columns when rows differ in keys (a missing key is an empty cell);
    by default the first row's keys are the columns. The JSON may carry more than the table
    (``payload``), e.g. the question ids the table was scored on.
    """
    if not rows:
        raise ValueError(f"no rows to write to {stem}")
    stem.parent.mkdir(parents=True, exist_ok=True)
    with Path(f"{stem}.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(fields or rows[0]))
        w.writeheader()
        w.writerows(rows)
    Path(f"{stem}.json").write_text(json.dumps(rows if payload is None else payload, indent=1))


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """``rows`` as CSV at ``path``, every key a column (first-seen order; a missing key is an
    empty cell), floats to 6 places, or 6 significant digits below 0.001 (a p-value of 2e-36
    is not 0)."""
    with path.open("w", newline="") as fh:
        fields = list(dict.fromkeys(k for r in rows for k in r))
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: _rounded(v) if isinstance(v, float) else v for k, v in r.items()})


def _rounded(value: float) -> float:
    return float(f"{value:.6g}") if 0 < abs(value) < 1e-3 else round(value, 6)
