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
- ``restated u``: drop an LLM term whose cosine with ``q`` is at least ``u``: a term that
  restates the question is on topic without being personal (the LoCoMo seed-2 and PrefEval
  losses).
- ``gate + m``: a stricter history gate, kept plain unless the closest LLM term beats the
  closest history item by ``m`` in cosine with ``q``.
- ``anchor gap``: scale the anchor by ``1 − cos(q, â) / mean_i cos(h_i, â)`` (clipped to [0, 1]):
  less anchor for a query already as close to the centre of the history as its items are.

Rank-level variants (``RANK_VARIANTS``, the issue's "rank-level fusion of the plain and
personalized rankings"), applied to the plain and the ``"safe"`` rankings (depth ``DEPTH``):
- ``rrf c, plain w``: reciprocal rank fusion, ``w / (c + rank_plain) + 1 / (c + rank_safe)``;
  ``RANK_GRID`` crosses ``c`` in (0, 1, 2, 5, 10, 20, 60) with ``w`` in (.25, .5, .75, .9, 1).
- ``keep plain top j``: the ``safe`` ranking, except that the plain query's ``j`` best items
  are kept in the top 5 (``j`` in 1, 2, 3).
- ``top-5 overlap ≥ t``: the ``safe`` ranking when its top 5 shares at least ``t`` items with the
  plain top 5, else the plain ranking (the issue's "how far the shifted query moves the top-k").
The table shows three of them; every grid setting, with its verdict by the adoption rule and the
number of cells where it falls below plain, goes to ``safe_variants_rank.{csv,json}``.

    python benchmarks/safe_variants.py

Writes ``benchmarks/results/safe_variants.{csv,json}`` and ``safe_variants_rank.{csv,json}``
and prints both tables.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from pbr_bench.metrics import evaluate
from pbr_bench.report import write_rows
from pbr_bench.runner import Bench, MethodRun
from pbr_bench.safe import FIELDS, OUT, admissible, benches, score
from pbr_core.fusion import FusionInputs, FusionResult, default_rule, fuse

Rule = Callable[..., FusionResult]
#: ``(plain ranking, safe ranking) -> ranking``
RankRule = Callable[[Sequence[str], Sequence[str]], list[str]]
#: Ranking depth for the rank-level variants (R@5 / N@5 of the other variants do not depend on it).
DEPTH = 50


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


def restated(u: float) -> Rule:
    def rule(q, anchor, f_avg, r, related, history, **kw):  # type: ignore[no-untyped-def]
        def keep(v: Any) -> Any:
            return v if v is None or float(_unit(v) @ _unit(q)) < u else None

        return fuse(q, anchor=anchor, f_avg=keep(f_avg), r=keep(r), **kw)

    return rule


def gate_margin(m: float) -> Rule:
    def rule(q, anchor, f_avg, r, related, history, best_history_cos=None, **kw):  # type: ignore[no-untyped-def]
        gate = None if best_history_cos is None else best_history_cos + m
        return fuse(q, anchor=anchor, f_avg=f_avg, r=r, best_history_cos=gate, **kw)

    return rule


def anchor_gap(q, anchor, f_avg, r, related, history, **kw):  # type: ignore[no-untyped-def]
    if anchor is not None:
        a = _unit(anchor)
        centre = float(np.mean(np.asarray(history.vectors, dtype=np.float64) @ a))
        share = float(np.clip(1.0 - float(_unit(q) @ a) / centre, 0.0, 1.0)) if centre > 0 else 0
        anchor = None if share == 0.0 else np.asarray(anchor) * share
    return fuse(q, anchor=anchor, f_avg=f_avg, r=r, **kw)


def rrf(c: int, plain_weight: float = 1.0) -> RankRule:
    def rule(plain: Sequence[str], safe: Sequence[str]) -> list[str]:
        score: dict[str, float] = {}
        for rank, doc in enumerate(plain, 1):
            score[doc] = score.get(doc, 0.0) + plain_weight / (c + rank)
        for rank, doc in enumerate(safe, 1):
            score[doc] = score.get(doc, 0.0) + 1.0 / (c + rank)
        order = {doc: i for i, doc in enumerate(safe)}  # ties go to the safe ranking's order
        return sorted(score, key=lambda d: (-score[d], order.get(d, len(order))))

    return rule


def overlap_at_least(t: int, k: int = 5) -> RankRule:
    def rule(plain: Sequence[str], safe: Sequence[str]) -> list[str]:
        return list(safe if len(set(plain[:k]) & set(safe[:k])) >= t else plain)

    return rule


def keep_plain_top(j: int, k: int = 5) -> RankRule:
    def rule(plain: Sequence[str], safe: Sequence[str]) -> list[str]:
        kept = list(plain[:j])
        chosen = set(kept) | set([d for d in safe if d not in kept][: k - len(kept)])
        head = [d for d in safe if d in chosen]
        head += [d for d in kept if d not in head]  # a kept item the safe search did not reach
        return head + [d for d in safe if d not in chosen]

    return rule


RANK_GRID: dict[str, RankRule] = {
    **{
        f"rrf {c}, plain {w:g}": rrf(c, w)
        for c in (0, 1, 2, 5, 10, 20, 60)
        for w in (0.25, 0.5, 0.75, 0.9, 1.0)
    },
    **{f"keep plain top {j}": keep_plain_top(j) for j in (1, 2, 3)},
    **{f"top-5 overlap ≥ {t}": overlap_at_least(t) for t in (1, 2, 3, 4)},
}
#: Shown in the main table: classic RRF, the grid's best by the adoption rule, and keep-top-2.
RANK_VARIANTS = ["rrf 60, plain 1", "rrf 5, plain 0.25", "keep plain top 2"]

VARIANTS: dict[str, Rule | None] = {
    "safe": None,
    "agree 0": agree(0.0),
    "agree 0.05": agree(0.05),
    "agree 0.1": agree(0.1),
    "region 0.9": region(0.9),
    "region 0.95": region(0.95),
    "restated .85": restated(0.85),
    "gate + .05": gate_margin(0.05),
    "gate + .1": gate_margin(0.1),
    "anchor gap": anchor_gap,
}


@contextlib.contextmanager
def variant(bench: Bench, rule: Rule | None) -> Iterator[None]:
    """Route the bench's ``"safe"`` fusion through ``rule`` (``Personalizer.fusion_rule``), which
    also sees the vectors of the related history and the user's history."""
    if rule is None:
        yield
        return

    def routed(inputs: FusionInputs) -> FusionResult:
        cfg = inputs.config
        if cfg.fusion != "safe":
            return default_rule(inputs)
        related = np.asarray(inputs.history.vectors, dtype=np.float64)[list(inputs.related)]
        return rule(
            inputs.q,
            inputs.anchor,
            inputs.f_avg,
            inputs.r,
            related,
            inputs.history,
            mode="safe",
            trust_low=cfg.trust_low,
            trust_high=cfg.trust_high,
            safe_min_shift=cfg.safe_min_shift,
            best_history_cos=inputs.best_history_cos,
            history_gate=cfg.safe_history_gate,
        )

    personalizer = bench.personalizer
    before = personalizer.fusion_rule
    personalizer.fusion_rule = routed
    try:
        yield
    finally:
        personalizer.fusion_rule = before


def ranked(bench: Bench, plain: MethodRun, safe: MethodRun, rule: RankRule) -> MethodRun:
    """``rule`` applied per question to the plain and safe rankings, scored like a bench run."""
    rankings = {q: rule(plain.rankings[q], safe.rankings[q]) for q in safe.rankings}
    gold = {q.id: q.gold for q in bench.queries}
    metrics = evaluate(rankings, gold, ks=(5,))
    return MethodRun(method="pbr-safe", llm=safe.llm, rankings=rankings, metrics=metrics, seconds=0)


def adoption(rows: list[dict[str, Any]], label: str) -> dict[str, Any]:
    """The sweep's rule for one variant: admissible on PersonaBench 0.0 (every source at least
    plain, the authors' at least the paper), its worst-case and mean R@5 gain there, and how
    many cells anywhere fall below plain on R@5 or N@5."""
    mine = {(r["dataset"], r["llm"], r["seed"]): r for r in rows if r["fusion"] == label}
    plain = {(r["dataset"], r["llm"], r["seed"]): r for r in rows if r["fusion"] == "plain"}
    pb = [key for key in mine if key[0] == "personabench-0.0"]
    gains = [mine[key]["R@5"] - plain[key]["R@5"] for key in pb]
    below = [k for k in mine if not admissible({"cell": mine[k]}, {"cell": plain[k]}, False)]
    return {
        "variant": label,
        "admissible": admissible(
            {key[1]: mine[key] for key in pb}, {key[1]: plain[key] for key in pb}, True
        ),
        "worst_gain": round(min(gains), 4),
        "mean_gain": round(sum(gains) / len(gains), 4),
        "cells_below_plain": len(below),
        "cells": len(mine),
    }


def main() -> int:
    rows: list[dict[str, Any]] = []
    grid_rows: list[dict[str, Any]] = []
    for ds, bench, llm, seed in benches():
        bench.k = DEPTH
        plain = bench.run("plain", progress=False)
        runs = {"plain": plain, "paper": bench.run("pbr", progress=False)}
        for label, rule in VARIANTS.items():
            with variant(bench, rule):
                runs[label] = bench.run("pbr-safe", progress=False)
        grid = {label: ranked(bench, plain, runs["safe"], r) for label, r in RANK_GRID.items()}
        scored = {
            label: score(ds, bench, llm, seed, label, run, plain)
            for label, run in {**runs, **grid}.items()
        }
        rows += [scored[label] for label in [*runs, *RANK_VARIANTS]]
        grid_rows += [scored[label] for label in ["plain", "safe", *RANK_GRID]]
    write_rows(rows, OUT / "safe_variants", fields=FIELDS)
    labels = ["plain", "paper", *VARIANTS, *RANK_VARIANTS]
    print(f"{'cell':44}" + "".join(f"{label[:12]:>13}" for label in labels))
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
    verdicts = sorted(
        (adoption(grid_rows, label) for label in ["safe", *RANK_GRID]),
        key=lambda v: (not v["admissible"], -v["worst_gain"], -v["mean_gain"]),
    )
    write_rows(verdicts, OUT / "safe_variants_rank", fields=list(verdicts[0]))
    print("\nrank-level grid by the adoption rule (PersonaBench 0.0), best first:")
    for v in verdicts:
        print("  ".join(f"{k}={v[k]}" for k in v))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
