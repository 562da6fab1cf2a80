"""One parameter set for the hybrid search on every data set (issue #42), no LLM.

Why: the default hybrid rule (``w = √coverage``, unstemmed BM25 with ``k1 = 1.5``, ``b = 0.75``)
misses the issue's conversation goals (LoCoMo R@5 session ≥ .88, turn ≥ .57; recall_any@5 on
every question with evidence ≥ .94 / .62), and on LoCoMo turn level stemmed BM25 alone beats the
stemmed hybrid, so the lexical leg is underweighted there. This script searches, on the tuning
split of every data set at once, for one parameter set of the lexical leg and the fusion:

- the analyzer: stemming (None / English Snowball) × BM25 ``k1`` × ``b``;
- the lexical weight as a function of the coverage ``c = max bm25 / ceiling``: ``c^p``,
  ``min(1, a · c^p)``, ``a · c^p`` (the lexical leg may outweigh the dense one), and a weighted
  reciprocal-rank fusion ``1 / (k + rank_dense) + w / (k + rank_bm25)``;
- where ``c`` is read: the same analyzer, or the unstemmed default analyzer while the scores are
  stemmed (the rule ``docs/hybrid.md`` left for a later round);
- neighbour context for the lexical leg: each item's BM25 plus ``α`` × the mean of its two
  neighbours' in the history's order (the order items were added: a conversation's turns), a
  general feature, not a data set's parsing.

The question words ("what", "when", "did", ...) are already in pbr's stop-word list
(``pbr_core.lexical.ENGLISH_STOP_WORDS``), so the query side is not varied.

Data sets: PersonaBench 0.0 and 0.7, LoCoMo turn and session level (the current question set,
and every question with evidence, ``-all``, adversarial included: the set published numbers
use), PrefEval explicit with 10, 50, 100 and 300 fillers. PersonaBench 0.3 and 0.5 were added
after the choice had been made and read: they are reported, not part of the rule.

Protocol, fixed before any number of this script was read:

- Tuning split: :func:`pbr_bench.splits.is_tuning_question` (LoCoMo and PrefEval: the users with
  ``sha1(user_id) % 3 == 0``; PersonaBench: the questions with ``sha1(question_id) % 3 == 0``),
  the split of ``hybrid_adaptive.py`` and ``stemming.py``. Everything else is the test split.
- Baselines, fixed: ``dense`` (no windows), ``bm25`` (the library's lexical mode today:
  unstemmed, k1 1.5, b .75, ties in the dense order), ``rrf`` (LangChain's ensemble rule, c = 60,
  over those two rankings), and ``default`` (the hybrid search shipped today).
- A candidate is admissible when, on the tuning split, on no data set (PersonaBench 0.0, 0.7,
  LoCoMo turn, session, PrefEval N = 10, 50, 100, 300) and on neither R@5 nor N@5 it is
  significantly below a baseline or the default (two-sided sign test p < .05, more losses than
  wins), and it has no more (data set, metric) cells below max(dense, bm25, rrf) on the mean
  than the default has.
- Among the admissible, the choice is the highest mean of the four conversation goals' numbers
  on the tuning split (LoCoMo turn and session R@5, LoCoMo -all turn and session
  recall_any@5); ties by the mean of R@5 and N@5 over the eight data sets.
- The choice is then read once on the test split: per data set, per-question wins / losses and
  the sign test against dense, bm25, rrf and the default (R@5 and N@5); the project's "no worse"
  reading: not significantly below (p < .05) and not below on the mean.

The search runs in stages on the tuning split only: (A) every analyzer with today's weight
``√c`` and as BM25 alone; (B) every weight function × coverage source × neighbour ``α`` on the
analyzers (A) ranks best by the choice rule's objective, plus the default analyzer. Nothing is
tuned on the test split.

No LLM. Embeddings come from the on-disk cache (``.pbr-cache/``; missing ones are encoded with
all-MiniLM-L6-v2 once); the per-question leg scores are cached in
``.pbr-cache/hybrid_tuning-<code>/<data set>.pkl`` (``<code>``:
:func:`pbr_bench.paths.scratch_dir`). Deterministic: no randomness.

Run (from the repository root)::

    python benchmarks/hybrid_tuning.py

Writes ``benchmarks/results/hybrid/tuning.{csv,json}`` (every candidate on the tuning split;
the choice and the default on every split; the paired tests) and ``tuning.png`` (every
candidate: the conversation goals against PrefEval), and prints the tables.
"""

from __future__ import annotations

import itertools
import json
import pickle
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pbr_bench import one_set
from pbr_bench.metrics import best_over_combinations, recall_any_at_k
from pbr_bench.one_set import (
    CUT,
    METRICS,
    RULE_SETS,
    SHORT,
    Row,
    Scores,
    built_with_main,
    load_all,
    objective,
    question_row,
    ranks,
    view_cells,
    views,
)
from pbr_bench.paths import REPO_ROOT, RESULTS_DIR, scratch_dir
from pbr_bench.report import write_csv
from pbr_core.hybrid import lexical_query
from pbr_core.lexical import LexicalIndex, StemmerName

OUT = RESULTS_DIR / "hybrid"

#: Added after the choice had been made and read on the test split: reported for the choice and
#: the baselines, not in the rule (PersonaBench's other two noise levels).
ADDED_AFTER = ["personabench-0.3", "personabench-0.5"]
LOADED = [*one_set.LOADED, *ADDED_AFTER]
VIEWS = [*one_set.VIEWS, *ADDED_AFTER]

STEMMERS: tuple[StemmerName | None, ...] = (None, "english")
K1S = (0.25, 0.5, 0.9, 1.2, 1.5, 2.0)
BS = (0.0, 0.25, 0.5, 0.75, 1.0)
ANALYZERS: list[tuple[StemmerName | None, float, float]] = list(
    itertools.product(STEMMERS, K1S, BS)
)
DEFAULT_ANALYZER = ANALYZERS.index((None, 1.5, 0.75))
BASELINES = ("dense", "bm25", "rrf", "default")

# ---- collecting the legs ----------------------------------------------------------------------


def _variants(base: LexicalIndex, stemmer: StemmerName | None) -> list[LexicalIndex]:
    """``base``'s counts under every (k1, b) of the grid: k1 and b enter only the per-item norm,
    so the tokenized counts are shared rather than rebuilt 20 times per user."""
    return [
        LexicalIndex(base._vocab, base._tf, base._dl, k1=k1, b=b, stemmer=stemmer)
        for k1, b in itertools.product(K1S, BS)
    ]


def collect(name: str, scratch: Path) -> list[Row]:
    """Per question of data set ``name``: its split, gold, every item's cosine (best window and
    whole item) and BM25 score and ceiling under every analyzer of the grid, kept in
    ``scratch``."""
    path = scratch / f"{name}.pkl"
    if path.exists():
        rows: list[Row] = pickle.loads(path.read_bytes())
        return rows
    built, main_ids = built_with_main(name)
    indexes: dict[str, list[LexicalIndex]] = {}
    rows = []
    for q in built.queries:
        hw, hp = built.windowed.get(q.user_id), built.plain.get(q.user_id)
        if q.user_id not in indexes:
            texts = [it.text for it in hp.items]
            indexes[q.user_id] = [
                ix for s in STEMMERS for ix in _variants(LexicalIndex.build(texts, stemmer=s), s)
            ]
        v, terms = built.qvec[q.id], lexical_query(q.text)
        ixs = indexes[q.user_id]
        rows.append(
            question_row(
                name,
                q,
                main_ids,
                ids=[it.id for it in hp.items],
                gold=q.gold,
                win=np.asarray(hw.dense_scores(v), dtype=np.float64),
                dense=np.asarray(hp.dense_scores(v), dtype=np.float64),
                lex=np.stack([ix.scores(terms) for ix in ixs]),
                ceil=np.array([ix.ceiling(terms) for ix in ixs]),
            )
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(rows))
    return rows


# ---- the candidates ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """One parameter set: analyzer (index into ANALYZERS), where the coverage is read, the
    weight function and the fusion."""

    analyzer: int
    weight: str = "pow"  # "pow": c^p; "clip": min(1, a c^p); "scale": a c^p
    p: float = 0.5
    a: float = 1.0
    coverage_from: str = "same"  # "same" or "default" (the unstemmed default analyzer)
    alpha: float = 0.0  # neighbour context of the lexical leg
    fusion: str = "score"  # "score": min-max dense + w bm25/max; "rrf": weighted RRF
    rrf_k: float = 60.0

    @property
    def label(self) -> str:
        s, k1, b = ANALYZERS[self.analyzer]
        parts = [f"{'stem' if s else 'plain'} k1={k1:g} b={b:g}"]
        if self.weight == "pow":
            parts.append(f"w=c^{self.p:g}")
        elif self.weight == "clip":
            parts.append(f"w=min(1,{self.a:g}c^{self.p:g})")
        else:
            parts.append(f"w={self.a:g}c^{self.p:g}")
        if self.coverage_from != "same":
            parts.append("c: default analyzer")
        if self.alpha:
            parts.append(f"nbr α={self.alpha:g}")
        if self.fusion == "rrf":
            parts.append(f"rrf k={self.rrf_k:g}")
        return ", ".join(parts)


DEFAULT = Candidate(DEFAULT_ANALYZER)


def _mm(x: np.ndarray) -> np.ndarray:
    lo, hi = float(x.min()), float(x.max())
    return (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)


def _coverage(r: Row, a: int) -> float:
    ceil = float(r["ceil"][a])
    return min(1.0, float(r["lex"][a].max()) / ceil) if ceil > 0 else 0.0


def _neighbours(x: np.ndarray, alpha: float) -> np.ndarray:
    if not alpha or x.size < 2:
        return x
    left = np.concatenate([[0.0], x[:-1]])
    right = np.concatenate([x[1:], [0.0]])
    return x + alpha * 0.5 * (left + right)


def weight_of(c: Candidate, r: Row) -> float:
    cov = _coverage(r, c.analyzer if c.coverage_from == "same" else DEFAULT_ANALYZER)
    if cov <= 0:
        return 0.0
    w = cov**c.p
    if c.weight == "clip":
        return min(1.0, c.a * w)
    if c.weight == "scale":
        return c.a * w
    return w


def scores_of(c: Candidate, r: Row) -> np.ndarray:
    lex = _neighbours(r["lex"][c.analyzer].astype(np.float64), c.alpha)
    w = weight_of(c, r)
    if c.fusion == "rrf":
        if w == 0:
            return r["win"]
        tie = lex + 1e-9 * (r["win"] + 1)
        return 1 / (c.rrf_k + ranks(r["win"])) + w / (c.rrf_k + ranks(tie))
    top = float(lex.max())
    return _mm(r["win"]) + (w * lex / top if top > 0 else 0.0)


def baseline_scores(name: str, r: Row) -> np.ndarray:
    lex = r["lex"][DEFAULT_ANALYZER].astype(np.float64)
    if name == "dense":
        return r["dense"]
    if name == "bm25":
        return lex + 1e-9 * (r["dense"] + 1)
    if name == "rrf":
        return 1 / (60 + ranks(r["dense"])) + 1 / (60 + ranks(lex + 1e-9 * (r["dense"] + 1)))
    if name == "default":
        return scores_of(DEFAULT, r)
    raise ValueError(name)


def bm25_of(analyzer: int, r: Row) -> np.ndarray:
    return r["lex"][analyzer].astype(np.float64) + 1e-9 * (r["dense"] + 1)


# ---- scoring ----------------------------------------------------------------------------------


def per_question(r: Row, scores: np.ndarray) -> tuple[float, float, float]:
    top = tuple(np.argsort(-scores, kind="stable")[:CUT].tolist())
    memo = r.setdefault("_memo", {})
    hit = memo.get(top)
    if hit is None:
        ranked = [r["ids"][i] for i in top]
        rr, nn = best_over_combinations(ranked, r["gold"], CUT)
        hit = memo[top] = (rr, nn, recall_any_at_k(ranked, r["gold"], CUT))
    return hit


def evaluate(fn: Any, sets: dict[str, list[Row]], split: str) -> Scores:
    return {
        name: np.array(
            [per_question(r, fn(r)) for r in rows if split == "all" or r["split"] == split]
        ).reshape(-1, 3)
        for name, rows in sets.items()
    }


def overall(s: Scores) -> float:
    return float(np.mean([s[d][:, :2].mean() for d in RULE_SETS]))


def judge(s: Scores, base: dict[str, Scores]) -> dict[str, Any]:
    """The admissibility test of the protocol (one split): :func:`pbr_bench.one_set.judge`
    against every baseline and the default."""
    return one_set.judge(s, base, BASELINES)


def row_of(label: str, stage: str, s: Scores, verdict: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"candidate": label, "stage": stage}
    for d in VIEWS:
        for j, m in enumerate(METRICS):
            out[f"{d} {m}"] = float(s[d][:, j].mean())
    out["objective"] = objective(s)
    out["overall"] = overall(s)
    if verdict is not None:
        out["fails"] = len(verdict["fails"])
        out["sig. losses"] = len(verdict["losses"])
    return out


def print_table(rows: Sequence[dict[str, Any]], title: str) -> None:
    print(f"\n== {title}: R@5 / N@5 (LoCoMo -all: recall_any@5) ==")
    head = f"{'candidate':58}" + "".join(f"{SHORT[d]:>12}" for d in VIEWS)
    print(head + f"{'goal':>8}{'mean':>8}{'fails':>6}{'sig-':>5}")
    for r in rows:
        cells = view_cells(r)
        extra = f"{r.get('fails', ''):>6}{r.get('sig. losses', ''):>5}"
        print(f"{r['candidate'][:57]:58}{cells}{r['objective']:8.4f}{r['overall']:8.4f}{extra}")


def paired_rows(split: str, s: Scores, base: dict[str, Scores], label: str) -> list[dict]:
    return one_set.paired_rows(split, s, base, label, BASELINES, VIEWS)


def plot(records: Sequence[dict[str, Any]], chosen: str, path: Path) -> None:
    """Every hybrid candidate on the tuning split: the conversation goals' mean against PrefEval's
    mean N@5 (N = 10..300), the trade-off one parameter set has to make."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pe = [d for d in RULE_SETS if d.startswith("prefeval")]
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for stem, colour in (("plain", "tab:blue"), ("stem", "tab:orange")):
        rows = [r for r in records if "fails" in r and r["candidate"].startswith(stem)]
        ok = [r for r in rows if not r["sig. losses"]]
        bad = [r for r in rows if r["sig. losses"]]
        for group, marker, label in ((bad, "x", "significant loss"), (ok, "o", "no sig. loss")):
            if not group:
                continue
            ax.scatter(
                [np.mean([r[f"{d} N@5"] for d in pe]) for r in group],
                [r["objective"] for r in group],
                s=14,
                marker=marker,
                color=colour,
                alpha=0.6,
                label=f"{'stemmed' if stem == 'stem' else 'unstemmed'}, {label}",
            )
    for name, text in ((DEFAULT.label, "√c rule (before)"), (chosen, "chosen")):
        r = next(x for x in records if x["candidate"] == name and "fails" in x)
        xy = (float(np.mean([r[f"{d} N@5"] for d in pe])), r["objective"])
        ax.annotate(text, xy, xytext=(8, -12), textcoords="offset points", fontsize=9)
        ax.scatter(*xy, s=60, facecolors="none", edgecolors="black")
    ax.set_xlabel("PrefEval N@5, mean of N = 10, 50, 100, 300 (tuning split)")
    ax.set_ylabel("LoCoMo goals' mean (tuning split)")
    ax.set_title("One parameter set: conversations against PrefEval")
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def stage_b(analyzers: Sequence[int]) -> list[Candidate]:
    out = []
    for a_ix in analyzers:
        stemmed = ANALYZERS[a_ix][0] is not None
        for alpha in (0.0, 0.25, 0.5):
            for cov in ("same", "default") if stemmed else ("same",):
                common = dict(analyzer=a_ix, coverage_from=cov, alpha=alpha)
                for p in (0.25, 0.5, 0.75, 1.0):
                    out.append(Candidate(weight="pow", p=p, **common))  # type: ignore[arg-type]
                for a, p in itertools.product((1.5, 2.0, 3.0), (0.5, 1.0)):
                    out.append(Candidate(weight="clip", a=a, p=p, **common))  # type: ignore[arg-type]
                    out.append(Candidate(weight="scale", a=a, p=p, **common))  # type: ignore[arg-type]
                for k, a in itertools.product((10.0, 60.0), (1.0, 2.0)):
                    out.append(
                        Candidate(weight="scale", a=a, p=0.5, fusion="rrf", rrf_k=k, **common)  # type: ignore[arg-type]
                    )
    return list(dict.fromkeys(out))


def main() -> None:
    t0 = time.perf_counter()
    scratch = scratch_dir("hybrid_tuning", __file__)  # one fingerprint per run
    loaded = load_all(lambda name: collect(name, scratch), LOADED)
    sets = views(loaded, VIEWS)
    base = {b: evaluate(lambda r, b=b: baseline_scores(b, r), sets, "tune") for b in BASELINES}
    records: list[dict[str, Any]] = []
    for b in BASELINES:
        records.append(row_of(b, "baseline", base[b], None))

    # (A) every analyzer: BM25 alone, and hybrid with today's weight
    stage_a: list[tuple[Candidate, Scores, dict[str, Any]]] = []
    for a_ix in range(len(ANALYZERS)):
        lab = Candidate(a_ix).label.split(",")[0]
        s = evaluate(lambda r, a_ix=a_ix: bm25_of(a_ix, r), sets, "tune")
        records.append(row_of(f"bm25 {lab}", "A", s, None))
        c = Candidate(a_ix)
        s = evaluate(lambda r, c=c: scores_of(c, r), sets, "tune")
        v = judge(s, base)
        records.append(row_of(c.label, "A", s, v))
        stage_a.append((c, s, v))
    print_table([r for r in records if r["stage"] in ("baseline", "A")], "stage A, tuning split")
    print(f"({time.perf_counter() - t0:.0f}s)", flush=True)

    # (B) the weight functions on the analyzers (A) ranks best, per stemmer, and the default one
    picked = [DEFAULT_ANALYZER]
    for stem in STEMMERS:
        ranked = sorted(
            (x for x in stage_a if ANALYZERS[x[0].analyzer][0] == stem),
            key=lambda x: -objective(x[1]),
        )
        picked += [x[0].analyzer for x in ranked[:2]]
    picked = list(dict.fromkeys(picked))
    cands: list[tuple[Candidate, Scores, dict[str, Any]]] = [x for x in stage_a]
    for c in stage_b(picked):
        if c == Candidate(c.analyzer):
            continue
        s = evaluate(lambda r, c=c: scores_of(c, r), sets, "tune")
        v = judge(s, base)
        records.append(row_of(c.label, "B", s, v))
        cands.append((c, s, v))
    print(f"stage B: {len(cands) - len(stage_a)} candidates ({time.perf_counter() - t0:.0f}s)")
    b_rows = sorted((r for r in records if r["stage"] == "B"), key=lambda r: -r["objective"])
    print_table(b_rows[:40], "stage B, tuning split, best 40 by the objective")

    # the choice rule
    default_fails = len(judge(base["default"], base)["fails"])
    admissible = [x for x in cands if not x[2]["losses"] and len(x[2]["fails"]) <= default_fails]
    chosen, _, chosen_v = max(admissible, key=lambda x: (objective(x[1]), overall(x[1])))
    print(f"\ndefault's fails on the tuning split: {default_fails}; admissible: {len(admissible)}")
    print(f"chosen: {chosen.label} (fails: {chosen_v['fails']})")

    # the choice and the default on every split, paired against the baselines
    summary: list[dict[str, Any]] = []
    paired: list[dict[str, Any]] = []
    for split in ("tune", "test", "all"):
        bs = {b: evaluate(lambda r, b=b: baseline_scores(b, r), sets, split) for b in BASELINES}
        s = evaluate(lambda r: scores_of(chosen, r), sets, split)
        stem_bm25 = evaluate(
            lambda r: bm25_of(ANALYZERS.index(("english", 1.5, 0.75)), r), sets, split
        )
        for b in BASELINES:
            summary.append({"split": split, **row_of(b, "baseline", bs[b], None)})
        summary.append({"split": split, **row_of("bm25 stemmed", "baseline", stem_bm25, None)})
        summary.append({"split": split, **row_of(chosen.label, "chosen", s, judge(s, bs))})
        paired += paired_rows(split, s, bs, chosen.label)
        print_table(summary[-6:], f"{split} split: the baselines and the choice")
    print("\n== the choice vs each baseline, test split (wins / losses, sign test p) ==")
    for r in paired:
        if r["split"] == "test" and r["metric"] in ("R@5", "N@5"):
            flag = (
                " *"
                if (r["p_sign"] < 0.05 and r["losses"] > r["wins"]) or r["mean_delta"] < 0
                else ""
            )
            print(
                f"{r['dataset']:24}{r['metric']:>6} vs {r['baseline']:8}"
                f"{r['value']:8.4f} {r['baseline_value']:8.4f} {r['wins']:4d}/{r['losses']:<4d}"
                f" p {r['p_sign']:.2g}{flag}"
            )

    OUT.mkdir(parents=True, exist_ok=True)
    plot(records, chosen.label, OUT / "tuning.png")
    write_csv(OUT / "tuning.csv", records)
    (OUT / "tuning.json").write_text(
        json.dumps(
            {
                "analyzers": ANALYZERS,
                "chosen": {
                    "label": chosen.label,
                    **asdict(chosen),
                    "analyzer": ANALYZERS[chosen.analyzer],
                },
                "tuning split verdict of the choice": chosen_v,
                "default's fails": default_fails,
                "admissible": len(admissible),
                "candidates": records,
                "summary": summary,
                "paired": paired,
            },
            indent=1,
        )
        + "\n"
    )
    print(
        f"\nwrote {(OUT / 'tuning.json').relative_to(REPO_ROOT)} ({time.perf_counter() - t0:.0f}s)"
    )


if __name__ == "__main__":
    main()
