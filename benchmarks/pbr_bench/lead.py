"""A lead tested against the shipped hybrid rule under the one-parameter-set protocol (#42):
the fixed baselines of every question, the admissibility test, the choice on the tuning split
and its one reading on the test split. Shared by ``benchmarks/lexical_prf.py`` and
``benchmarks/lexical_fields.py``, which differ only in the candidates they rank.

Protocol (each script's docstring repeats it): the tuning split is
:func:`pbr_bench.splits.is_tuning_question`. A candidate is admissible when on no data set of
:data:`~pbr_bench.one_set.RULE_SETS` and on neither R@5 nor N@5 it is significantly below the
shipped rule on the tuning split (two-sided sign test p < .05, more losses than wins). Among the
admissible, the choice is the highest mean of the four LoCoMo goal numbers on the tuning split
(:func:`~pbr_bench.one_set.objective`); ties by the candidates' order. With none admissible, the
candidate with the fewest significant losses (ties: the goal mean) is read once on the test
split for reference, not as a choice. The test split is reported per data set, paired against
the shipped rule, and on the mean against dense, BM25 and RRF.
"""

from __future__ import annotations

import json
import pickle
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pbr_core.hybrid import lexical_query, rank
from pbr_core.lexical import LexicalIndex
from pbr_core.snapshot import UserHistory

from .compare import sign_summary
from .datasets import Query
from .metrics import best_over_combinations, recall_any_at_k
from .one_set import (
    CUT,
    METRICS,
    RULE_SETS,
    SHORT,
    VIEWS,
    Row,
    built_with_main,
    load_all,
    objective,
    question_row,
    ranks,
    view_cells,
    views,
)
from .one_set import write_csv as _write_csv
from .paths import REPO_ROOT, RESULTS_DIR, cache_dir

__all__ = ["BASELINES", "Candidates", "baselines", "collect", "metrics_of", "report", "run"]

#: The shipped rule and the fixed baselines of ``benchmarks/hybrid_tuning.py``.
BASELINES = ("shipped", "dense", "bm25", "rrf")


def metrics_of(ids: Sequence[str], order: Sequence[int], gold: Any) -> tuple[float, float, float]:
    """R@5, N@5 (PersonaBench's best-over-combinations rule) and recall_any@5 of a ranking
    (positions into ``ids``, best first)."""
    ranked = [ids[i] for i in order[:CUT]]
    rr, nn = best_over_combinations(ranked, gold, CUT)
    return rr, nn, recall_any_at_k(ranked, gold, CUT)


def baselines(
    hist: UserHistory,
    plain: UserHistory,
    vector: np.ndarray,
    own: dict[str, float],
    gold: Any,
    bm25: LexicalIndex,
) -> dict[str, tuple[float, float, float]]:
    """One question's :data:`BASELINES`: the shipped rule (``hist``, with windows), dense (no
    windows), BM25 (``bm25``: unstemmed, k1 1.5, b .75, ties in the dense order) and RRF
    (c = 60) over those two."""
    ids = [it.id for it in hist.items]
    out = {"shipped": metrics_of(ids, [r.position for r in rank(hist, vector, own, CUT)], gold)}
    dense = np.asarray(plain.dense_scores(vector), dtype=np.float64)
    lex = bm25.scores(own).astype(np.float64) + 1e-9 * (dense + 1)
    out["dense"] = metrics_of(ids, np.argsort(-dense, kind="stable").tolist(), gold)
    out["bm25"] = metrics_of(ids, np.argsort(-lex, kind="stable").tolist(), gold)
    rrf = 1 / (60 + ranks(dense)) + 1 / (60 + ranks(lex))
    out["rrf"] = metrics_of(ids, np.argsort(-rrf, kind="stable").tolist(), gold)
    return out


#: One question's candidates: ``(query, its user's history with windows, the user's words as
#: the lexical query, the query vector) -> candidate -> ranking`` (positions, best first).
Candidates = Callable[[Query, UserHistory, dict[str, float], np.ndarray], dict[str, list[int]]]


def collect(name: str, cache: Path, candidates: Candidates) -> list[Row]:
    """Data set ``name``'s rows: per question its split, whether it is in LoCoMo's current
    set, and the metrics of the :data:`BASELINES` and of each of ``candidates``' rankings;
    kept in ``cache/<name>.pkl`` (read back, not recomputed, when it exists)."""
    path = cache / f"{name}.pkl"
    if path.exists():
        rows: list[Row] = pickle.loads(path.read_bytes())
        return rows
    built, main_ids = built_with_main(name)
    bm25_ix: dict[str, LexicalIndex] = {}
    rows = []
    for q in built.queries:
        hist, plain = built.windowed.get(q.user_id), built.plain.get(q.user_id)
        ids = [it.id for it in hist.items]
        if q.user_id not in bm25_ix:
            texts = [it.text for it in hist.items]
            bm25_ix[q.user_id] = LexicalIndex.build(texts, k1=1.5, b=0.75)
        v = built.qvec[q.id]
        own = lexical_query(q.text)
        res = baselines(hist, plain, v, own, q.gold, bm25_ix[q.user_id])
        for label, order in candidates(q, hist, own, v).items():
            res[label] = metrics_of(ids, order, q.gold)
        rows.append(question_row(name, q, main_ids, res=res))
    cache.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(rows))
    return rows


def _scores(sets: dict[str, list[Row]], method: str, split: str) -> dict[str, np.ndarray]:
    return {
        d: np.array(
            [r["res"][method] for r in rows if split == "all" or r["split"] == split]
        ).reshape(-1, 3)
        for d, rows in sets.items()
    }


def _losses(s: dict[str, np.ndarray], ship: dict[str, np.ndarray]) -> list[str]:
    out = []
    for d in RULE_SETS:
        for j in (0, 1):
            w, l_, _, p = sign_summary(s[d][:, j] - ship[d][:, j])
            if p < 0.05 and l_ > w:
                out.append(f"{d} {METRICS[j]} ({w}/{l_}, p {p:.2g})")
    return out


def _summary_row(method: str, split: str, s: dict[str, np.ndarray], ship: Any) -> Row:
    out: Row = {"split": split, "method": method}
    for d in VIEWS:
        for j, m in enumerate(METRICS):
            out[f"{d} {m}"] = float(s[d][:, j].mean())
    out["goal mean"] = objective(s)
    if ship is not None:
        out["sig. losses vs shipped"] = "; ".join(_losses(s, ship))
    return out


def _print_table(rows: list[Row], title: str) -> None:
    print(f"\n== {title}: R@5 / N@5 (LoCoMo -all: recall_any@5) ==")
    print(f"{'method':26}" + "".join(f"{SHORT[d]:>12}" for d in VIEWS) + f"{'goal':>8}  losses")
    for r in rows:
        cells = view_cells(r)
        lost = r.get("sig. losses vs shipped", "")
        print(f"{r['method']:26}{cells}{r['goal mean']:8.4f}  {lost}")


def _plot(tuning: list[Row], chosen: str | None, path: Path) -> None:
    """The shipped rule and every candidate on the tuning split: the conversation goals' mean
    against PrefEval's mean N@5 (N = 10..300), the trade a lexical lead has to make; dense's
    PrefEval N@5 as a line (BM25 and RRF sit far below both axes' range)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pe = [d for d in RULE_SETS if d.startswith("prefeval")]

    def xy(r: Row) -> tuple[float, float]:
        return float(np.mean([r[f"{d} N@5"] for d in pe])), float(r["goal mean"])

    fig, ax = plt.subplots(figsize=(8, 5))
    dense = next(r for r in tuning if r["method"] == "dense")
    ax.axvline(xy(dense)[0], color="tab:gray", linestyle="--", linewidth=1, label="dense")
    shown = [r for r in tuning if r["method"] not in BASELINES or r["method"] == "shipped"]
    for i, r in enumerate(shown):
        if r["method"] == "shipped":
            style: dict[str, Any] = dict(marker="s", color="black")
        elif r.get("sig. losses vs shipped"):
            style = dict(marker="x", color="tab:red")
        else:
            style = dict(marker="o", color="tab:blue")
        size = 60 if r["method"] == chosen else 22
        ax.scatter(*xy(r), s=size, label=f"{i}: {r['method']}", **style)
        ax.annotate(str(i), xy(r), xytext=(4, 3), textcoords="offset points", fontsize=7)
    ax.set_xlabel("PrefEval N@5, mean of N = 10, 50, 100, 300 (tuning split)")
    ax.set_ylabel("LoCoMo goals' mean (tuning split)")
    ax.set_title(f"{path.stem}: blue admissible, red a significant loss, large the choice")
    ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(
    sets: dict[str, list[Row]],
    candidates: Sequence[str],
    out: Path,
    extra: dict[str, Any],
) -> None:
    """Choose among ``candidates`` on the tuning split, read the choice (or, with none
    admissible, the nearest candidate) once on the test split and on every question, print the
    tables and write ``out`` ``.csv``, ``.json`` (with ``extra`` first) and ``.png``."""
    methods = [*BASELINES, *candidates]
    ship_tune = _scores(sets, "shipped", "tune")
    tuning = []
    for method in methods:
        s = _scores(sets, method, "tune")
        tuning.append(_summary_row(method, "tune", s, None if method in BASELINES else ship_tune))
    _print_table(tuning, "tuning split")
    admissible = [
        r for r in tuning if r["method"] not in BASELINES and not r["sig. losses vs shipped"]
    ]
    chosen = max(admissible, key=lambda r: r["goal mean"])["method"] if admissible else None
    print(f"\nadmissible: {len(admissible)} of {len(candidates)}; chosen: {chosen}")
    shown = chosen
    if shown is None:
        cands = [r for r in tuning if r["method"] not in BASELINES]
        shown = min(
            cands,
            key=lambda r: (
                len([x for x in r["sig. losses vs shipped"].split("; ") if x]),
                -r["goal mean"],
            ),
        )["method"]
        print(f"reported for reference (fewest significant losses): {shown}")

    summary: list[Row] = []
    paired: list[Row] = []
    for split in ("test", "all"):
        ship = _scores(sets, "shipped", split)
        s = _scores(sets, shown, split)
        for b in BASELINES:
            summary.append(_summary_row(b, split, _scores(sets, b, split), None))
        summary.append(_summary_row(shown, split, s, ship))
        _print_table(summary[-5:], f"{split} split")
        for d in VIEWS:
            for j, m in enumerate(METRICS):
                if m == "recall_any@5" and not d.startswith("locomo"):
                    continue
                w, l_, mean, p = sign_summary(s[d][:, j] - ship[d][:, j])
                paired.append(
                    dict(
                        split=split,
                        candidate=shown,
                        dataset=d,
                        metric=m,
                        n=int(s[d].shape[0]),
                        value=float(s[d][:, j].mean()),
                        shipped=float(ship[d][:, j].mean()),
                        **{
                            f"{b} mean": float(_scores(sets, b, split)[d][:, j].mean())
                            for b in ("dense", "bm25", "rrf")
                        },
                        wins=w,
                        losses=l_,
                        mean_delta=mean,
                        p_sign=p,
                    )
                )
    print(f"\n== {shown} vs the shipped rule, test split (wins / losses, sign test p) ==")
    for r in paired:
        if r["split"] == "test":
            print(
                f"{r['dataset']:24}{r['metric']:>13}{r['value']:8.4f} {r['shipped']:8.4f}"
                f" {r['wins']:4d}/{r['losses']:<4d} p {r['p_sign']:.2g}"
            )

    out.parent.mkdir(parents=True, exist_ok=True)
    _write_csv(out.with_suffix(".csv"), tuning + summary)
    data = {
        **extra,
        "chosen": chosen,
        "reported on the test split": shown,
        "admissible": [r["method"] for r in admissible],
        "tuning": tuning,
        "summary": summary,
        "paired": paired,
    }
    out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    _plot(tuning, chosen, out.with_suffix(".png"))
    print(f"\nwrote {out.with_suffix('.json').relative_to(REPO_ROOT)}")


def run(name: str, candidates: Sequence[str], ranked: Candidates, extra: dict[str, Any]) -> None:
    """A lead script's whole run: every data set's rows (cached in ``$PBR_CACHE_DIR/<name>``),
    then :func:`report` to ``benchmarks/results/hybrid/<name>.{csv,json,png}``."""
    t0 = time.perf_counter()
    sets = views(load_all(lambda data_set: collect(data_set, cache_dir() / name, ranked)))
    report(sets, candidates, RESULTS_DIR / "hybrid" / name, extra)
    print(f"({time.perf_counter() - t0:.0f}s)")
