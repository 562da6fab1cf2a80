"""Variants of ``"safe"`` fusion that were tried and not adopted, scored from caches (issue #9).

Each variant is a query-time rule on top of the library's ``"safe"`` fusion, scored on every cell
of ``benchmarks/safe_report.py`` (PersonaBench 0.0 / 0.7 with the authors' and both local LLMs'
generations, LoCoMo turn level seeds 0 and 1, PrefEval N = 10 and 50) with LLM answers from the
generation cache only. The adoption rule is the sweep's (``benchmarks/safe_sweep.py``): on
PersonaBench 0.0, R@5 and N@5 at least the plain query's for every LLM source and at least the
paper's PBR with the authors' generations, then the largest worst-case R@5 gain.

Variants (``VARIANTS``):
- ``agree m``: drop an LLM term unless it is at least as close to the user's related history
  (mean cosine with the ``k1`` items shown to the LLM) as the query is, less a margin ``m``;
  the issue's "agreement with the user's related history".
- ``region t``: shrink the move so that the personalized query keeps cosine ≥ ``t`` with ``q``.
- ``anchor gap``: scale the anchor by ``1 − cos(q, â) / mean_i cos(h_i, â)`` (clipped to [0, 1]):
  less anchor for a query already as close to the centre of the history as its items are.

    python benchmarks/safe_variants.py

Writes ``benchmarks/results/safe_variants.{csv,json}`` and prints the table.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from safe_report import FIELDS, OUT, benches, score  # noqa: E402

import pbr_core.pipeline as pipeline  # noqa: E402
from pbr_core.bench.report import write_rows  # noqa: E402
from pbr_core.fusion import FusionResult, fuse  # noqa: E402
from pbr_core.history import UserHistory  # noqa: E402

Rule = Callable[..., FusionResult]


def _unit(v: Any) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64)
    n = float(np.linalg.norm(v))
    return v / n if n else v


def agree(margin: float) -> Rule:
    def rule(q, anchor, f_avg, r, related, history, **kw):  # type: ignore[no-untyped-def]
        near = float(np.mean(related @ _unit(q)))

        def keep(v: Any) -> Any:
            return v if v is None or float(np.mean(related @ _unit(v))) >= near - margin else None

        return fuse(q, anchor=anchor, f_avg=keep(f_avg), r=keep(r), **kw)

    return rule


def region(tau: float) -> Rule:
    def rule(q, anchor, f_avg, r, related, history, **kw):  # type: ignore[no-untyped-def]
        res = fuse(q, anchor=anchor, f_avg=f_avg, r=r, **kw)
        q64 = np.asarray(q, dtype=np.float64)
        move = res.vector.astype(np.float64) - q64
        lo, hi = 0.0, 1.0
        if _unit(q64 + move) @ _unit(q64) >= tau:
            return res
        for _ in range(30):  # bisection on the share of the move kept
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _unit(q64 + mid * move) @ _unit(q64) >= tau else (lo, mid)
        vector = (q64 + lo * move).astype(np.float32)
        return FusionResult(vector, res.w1, res.w2, res.used, res.trust, res.fallback)

    return rule


def anchor_gap(q, anchor, f_avg, r, related, history, **kw):  # type: ignore[no-untyped-def]
    if anchor is not None:
        a = _unit(anchor)
        centre = float(np.mean(np.asarray(history.vectors, dtype=np.float64) @ a))
        share = float(np.clip(1.0 - float(_unit(q) @ a) / centre, 0.0, 1.0)) if centre > 0 else 0
        anchor = None if share == 0.0 else np.asarray(anchor) * share
    return fuse(q, anchor=anchor, f_avg=f_avg, r=r, **kw)


VARIANTS: dict[str, Rule | None] = {
    "safe": None,
    "agree 0": agree(0.0),
    "agree 0.05": agree(0.05),
    "agree 0.1": agree(0.1),
    "region 0.9": region(0.9),
    "region 0.95": region(0.95),
    "anchor gap": anchor_gap,
}


@contextlib.contextmanager
def variant(rule: Rule | None) -> Iterator[None]:
    """Route ``"safe"`` fusion through ``rule``, which also sees the vectors of the related
    history and the user's history (read from the request the pipeline is finishing)."""
    if rule is None:
        yield
        return
    finish = pipeline.Personalizer._finish
    seen: dict[str, Any] = {}

    def spy_finish(self, req, parsed, vecs):  # type: ignore[no-untyped-def]
        history: UserHistory = req.history
        rows = [history.position(h.id) for h in req.explanation.related]
        seen["history"] = history
        seen["related"] = np.asarray(history.vectors, dtype=np.float64)[rows]
        return finish(self, req, parsed, vecs)

    def routed(q, *, anchor=None, f_avg=None, r=None, mode="full", **kw):  # type: ignore[no-untyped-def]
        if mode != "safe":
            return fuse(q, anchor=anchor, f_avg=f_avg, r=r, mode=mode, **kw)
        return rule(q, anchor, f_avg, r, seen["related"], seen["history"], mode=mode, **kw)

    with (
        mock.patch.object(pipeline.Personalizer, "_finish", spy_finish),
        mock.patch.object(pipeline, "fuse", routed),
    ):
        yield


def main() -> int:
    rows: list[dict[str, Any]] = []
    for ds, bench, llm, seed in benches():
        plain = bench.run("plain", progress=False)
        runs = {"plain": plain, "paper": bench.run("pbr", progress=False)}
        for label, rule in VARIANTS.items():
            with variant(rule):
                runs[label] = bench.run("pbr-safe", progress=False)
        rows += [score(ds, bench, llm, seed, label, run, plain) for label, run in runs.items()]
    write_rows(rows, OUT / "safe_variants", fields=FIELDS)
    labels = ["plain", "paper", *VARIANTS]
    print(f"{'cell':44}" + "".join(f"{label:>13}" for label in labels))
    cell_keys = dict.fromkeys((r["dataset"], r["llm"], r["seed"]) for r in rows)
    for key in cell_keys:
        got = {r["fusion"]: r for r in rows if (r["dataset"], r["llm"], r["seed"]) == key}
        print(
            f"{' '.join(map(str, key)):44}"
            + "".join(
                f"{got[label]['R@5']:>7.4f} "
                + f"{got[label].get('wins', ''):>2}/{got[label].get('losses', ''):<2}"
                for label in labels
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
