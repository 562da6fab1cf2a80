"""A data set's users as pbr histories, the way the hybrid benchmarks rank them.

Each user's items go into two :class:`~pbr_core.history.HistoryStore` objects: one as the library
stores them by default (items longer than the embedder reads split into windows,
:func:`pbr_core.windows.split`) and one without windows, so a benchmark can separate the windows'
effect from the fusion's. Vectors come from the on-disk :class:`~pbr_bench.embed.EmbeddingCache`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pbr_core.history import HistoryStore
from pbr_core.items import HistoryItem
from pbr_core.snapshot import UserHistory
from pbr_core.windows import Window, split, window_of

from .datasets import Dataset, Query, load_named
from .embed import CountingEncoder, EmbeddingCache
from .splits import is_tuning_question

__all__ = ["DATASETS", "Built", "WindowStats", "build", "encoders", "item_ids"]

#: The six data sets of the hybrid-search benchmarks (benchmarks/hybrid*.py), in table order.
DATASETS = [
    "personabench-0.0",
    "personabench-0.7",
    "locomo-turn",
    "locomo-session",
    "prefeval-explicit-n10",
    "prefeval-explicit-n50",
]


@dataclass
class WindowStats:
    """How many items were long and how many window vectors they took."""

    items: int = 0
    long_items: int = 0
    windows: int = 0
    windows_newly_encoded: int = 0


@dataclass
class Built:
    """One data set's users in two stores (with and without windows) and its questions."""

    ds: Dataset
    plain: HistoryStore
    windowed: HistoryStore
    queries: list[Query]
    qvec: dict[str, np.ndarray]
    stats: WindowStats
    split_of: dict[str, str] = field(default_factory=dict)  # question id -> "test" / "tune"


def build(
    name: str,
    cache: EmbeddingCache,
    counter: CountingEncoder,
    window: Window,
    tuning: Callable[[str, str, str], bool] = is_tuning_question,
) -> Built:
    """Load data set ``name`` and store every asking user's items (``counter`` is the encoder
    behind ``cache``; it counts the window texts that were not cached yet). ``tuning(data set,
    user, question)`` names the tuning split: by default the one the shipped hybrid rule was
    chosen on (:func:`~pbr_bench.splits.is_tuning_question`: a third of PersonaBench's
    questions too), so no question it was tuned on is reported as test."""
    ds = load_named(name)
    queries = ds.scored_queries
    users = sorted({q.user_id for q in queries})
    plain, windowed = HistoryStore(), HistoryStore()
    stats = WindowStats()
    for user in users:
        corpus = ds.corpora[user]
        items = [HistoryItem(id=d.id, text=d.text) for d in corpus.docs]
        vectors = cache.encode(corpus.texts)
        long_ids: list[str] = []
        parts: list[list[str]] = []
        for item in items:
            if not window.fits(item.text):
                long_ids.append(item.id)
                parts.append(split(item.text, window))
        flat = [w for ws in parts for w in ws]
        windows: dict[str, np.ndarray] = {}
        if flat:
            before = counter.encoded
            wvec = cache.encode(flat)
            stats.windows_newly_encoded += counter.encoded - before
            start = 0
            for item_id, ws in zip(long_ids, parts):
                windows[item_id] = wvec[start : start + len(ws)]
                start += len(ws)
        stats.items += len(items)
        stats.long_items += len(long_ids)
        stats.windows += len(flat)
        plain.upsert(user, items, vectors)
        windowed.upsert(user, items, vectors, windows=windows)
    qv = cache.encode([q.text for q in queries])
    return Built(
        ds=ds,
        plain=plain,
        windowed=windowed,
        queries=queries,
        qvec={q.id: qv[i] for i, q in enumerate(queries)},
        stats=stats,
        split_of={q.id: "tune" if tuning(name, q.user_id, q.id) else "test" for q in queries},
    )


def encoders() -> tuple[CountingEncoder, EmbeddingCache, Window]:
    """The MiniLM embedding cache (and its counter) and the window :func:`build` is given."""
    from pbr_core.models import MiniLMEmbedder

    counter = CountingEncoder()
    window = window_of(MiniLMEmbedder())
    assert window is not None
    return counter, EmbeddingCache("all-MiniLM-L6-v2", counter), window


def item_ids(history: UserHistory, ranked: Any) -> list[str]:
    """The item ids of a :func:`pbr_core.hybrid.rank` result, best first."""
    return [history.items[r.position].id for r in ranked]
