"""Sanity check of the harness: plain dense and BM25 baselines against published numbers.

The plain-query baseline on PersonaBench noise 0.0 with all-MiniLM-L6-v2 must give the PBR
paper's Overall R@5 = .3783 and N@5 = .3074 exactly; if it does not, the document serialization,
the encoder or the scorer differs from the authors' and no PBR number can be compared.

Run (embeddings are cached, so a re-run takes seconds)::

    HF_HUB_OFFLINE=1 python -m pbr_bench.check_baselines            # PersonaBench + LoCoMo
    python -m pbr_bench.check_baselines --only personabench --out results/check.json

Prints one table row per (data set, method) and writes the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from tqdm import tqdm

from pbr_bench.bm25 import BM25Index
from pbr_bench.datasets import Dataset, load_locomo, load_personabench
from pbr_bench.embed import EmbeddingCache, dense_rank, minilm_encoder
from pbr_bench.metrics import evaluate

__all__ = ["PAPER_PLAIN_PERSONABENCH", "bm25_rankings", "main", "plain_dense_rankings"]

#: Overall (R@5, N@5) of the plain query with all-MiniLM-L6-v2, PBR paper (spec §4.1).
PAPER_PLAIN_PERSONABENCH = (0.3783, 0.3074)


def plain_dense_rankings(ds: Dataset, cache: EmbeddingCache, k: int) -> dict[str, list[str]]:
    """Search each user's corpus with the embedded question (no personalization).

    Each corpus is embedded in one call and each question on its own (batch of one), as in the
    authors' scorer, so even near-ties come out the same.
    """
    rankings: dict[str, list[str]] = {}
    by_user: dict[str, list[str]] = {}
    texts: dict[str, str] = {}
    for q in ds.queries:
        by_user.setdefault(q.user_id, []).append(q.id)
        texts[q.id] = q.text
    for uid, qids in tqdm(by_user.items(), desc=f"{ds.name} dense", unit="user"):
        corpus = ds.corpora[uid]
        doc_vecs = cache.encode(corpus.texts)
        q_vecs = cache.encode([texts[i] for i in qids], batch_size=1)
        for qid, ranked in zip(qids, dense_rank(doc_vecs, corpus.ids, q_vecs, k), strict=True):
            rankings[qid] = ranked
    return rankings


def bm25_rankings(ds: Dataset, k: int) -> dict[str, list[str]]:
    """BM25 over each user's corpus with the question as the query."""
    rankings: dict[str, list[str]] = {}
    by_user: dict[str, list[tuple[str, str]]] = {}
    for q in ds.queries:
        by_user.setdefault(q.user_id, []).append((q.id, q.text))
    for uid, items in by_user.items():
        corpus = ds.corpora[uid]
        ranked = BM25Index(corpus.ids, corpus.texts).search([t for _, t in items], k)
        rankings.update(zip([i for i, _ in items], ranked, strict=True))
    return rankings


def _score(
    ds: Dataset, rankings: dict[str, list[str]], ks: Sequence[int]
) -> dict[str, dict[str, float]]:
    scored = ds.scored_queries
    return evaluate(
        rankings,
        {q.id: q.gold for q in scored},
        ks=ks,
        categories={q.id: q.category for q in scored},
    )


def _rows(
    ds: Dataset, method: str, result: dict[str, dict[str, float]]
) -> Iterable[dict[str, object]]:
    for category, metrics in result.items():
        yield {"dataset": ds.name, "method": method, "category": category, **metrics}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the checks; exit status 1 if the PersonaBench plain baseline is off the paper's."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["personabench", "locomo"], default=None)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)

    cache = EmbeddingCache("all-MiniLM-L6-v2", minilm_encoder(), cache_dir=args.cache_dir)
    rows: list[dict[str, object]] = []
    ok = True
    if args.only in (None, "personabench"):
        ds = load_personabench("0.0", data_dir=args.data_dir)
        plain = _score(ds, plain_dense_rankings(ds, cache, 5), (5,))
        rows += _rows(ds, "plain", plain)
        rows += _rows(ds, "bm25", _score(ds, bm25_rankings(ds, 5), (5,)))
        got = (round(plain["Overall"]["R@5"], 4), round(plain["Overall"]["N@5"], 4))
        ok = got == PAPER_PLAIN_PERSONABENCH
        print(
            f"PersonaBench plain R@5/N@5 {got} vs paper {PAPER_PLAIN_PERSONABENCH}: "
            f"{'OK' if ok else 'MISMATCH'}"
        )
    if args.only in (None, "locomo"):
        for level in ("turn", "session"):
            ds = load_locomo(level, data_dir=args.data_dir)
            ks = (1, 5, 10)
            rows += _rows(ds, "plain", _score(ds, plain_dense_rankings(ds, cache, 10), ks))
            rows += _rows(ds, "bm25", _score(ds, bm25_rankings(ds, 10), ks))

    cache.compact()
    cols = ["R@1", "R@5", "N@5", "R@10", "N@10", "Hit@5", "MRR"]
    print(
        f"{'dataset':<18} {'method':<6} {'category':<18} {'n':>5} "
        + " ".join(f"{c:>6}" for c in cols)
    )
    for r in rows:
        vals = " ".join(f"{r[c]:6.4f}" if c in r else f"{'':>6}" for c in cols)
        print(f"{r['dataset']!s:<18} {r['method']!s:<6} {r['category']!s:<18} {r['n']:5.0f} {vals}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
