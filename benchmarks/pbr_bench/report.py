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


def bar_png(
    path: Path,
    groups: Mapping[str, Mapping[str, float]],
    *,
    title: str,
    ylabel: str,
    log: bool = False,
) -> None:
    """A table's figure: grouped bars, one group per key of ``groups`` (a data set, a size),
    one bar per inner key (a method), the value above each bar; written to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(k for bars in groups.values() for k in bars))
    width = 0.8 / max(1, len(names))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(groups) * max(1, len(names)) ** 0.5), 4.5))
    for i, name in enumerate(names):
        xs = [g + (i - (len(names) - 1) / 2) * width for g in range(len(groups))]
        values = [bars.get(name, float("nan")) for bars in groups.values()]
        drawn = ax.bar(xs, values, width, label=name)
        ax.bar_label(drawn, fmt="%.3g", fontsize=6, rotation=90, padding=2)
    ax.set_xticks(range(len(groups)), list(groups), fontsize=8)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    low, high = ax.get_ylim()
    ax.set_ylim(low, high * (2.0 if log else 1.15))  # room for the values above the bars
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
