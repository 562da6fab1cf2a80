"""PNG plots of benchmark results (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def category_bars(
    runs: Sequence[Any],
    metric: str,
    title: str,
    path: Path,
    categories: Sequence[str] | None = None,
) -> Path:
    """Grouped bars: one group per category (``Overall`` first), one bar per method."""
    plt = _plt()
    cats = list(categories or [c for c in runs[0].metrics if c != "Overall"])
    cats = ["Overall", *[c for c in cats if c != "Overall"]]
    width = 0.8 / max(1, len(runs))
    fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(cats) + 2), 4.2))
    x = np.arange(len(cats))
    for i, run in enumerate(runs):
        vals = [run.metrics.get(c, {}).get(metric, 0.0) for c in cats]
        ax.bar(x + i * width - 0.4 + width / 2, vals, width, label=f"{run.method} ({run.llm})")
    ax.set_xticks(x, cats, rotation=15)
    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.legend(fontsize=7, ncols=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def sweep_heatmap(
    grid: np.ndarray, thetas: Sequence[float], k2s: Sequence[int], title: str, path: Path
) -> Path:
    """θ (rows) × k2 (columns) heatmap with the values written in the cells."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(1.3 * len(k2s) + 2, 0.45 * len(thetas) + 1.5))
    im = ax.imshow(grid, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(k2s)), [str(k) for k in k2s])
    ax.set_yticks(range(len(thetas)), [f"{t:.2f}" for t in thetas])
    ax.set_xlabel("k2")
    ax.set_ylabel("θ")
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            ax.text(j, i, f"{grid[i, j]:.3f}", ha="center", va="center", fontsize=7, color="w")
    ax.set_title(title)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
