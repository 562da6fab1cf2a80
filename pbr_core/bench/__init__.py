"""Benchmark harness (spec §4): data loaders, metrics, baselines. Not imported by pbr_core itself.

- :mod:`pbr_core.bench.datasets`: PersonaBench, LoCoMo and PrefEval in one shape
  (``Dataset`` → per-user ``UserCorpus`` + ``Query`` with gold ids), and the PBR authors' cached
  generations.
- :mod:`pbr_core.bench.metrics`: Recall/NDCG/hit/MRR and PersonaBench's best-over-combinations rule.
- :mod:`pbr_core.bench.embed`: the offline all-MiniLM-L6-v2 encoder and an on-disk embedding cache.
- :mod:`pbr_core.bench.bm25`: the BM25 baseline (``bm25s``).
- ``python -m pbr_core.bench.check_baselines``: plain dense and BM25 against published numbers.
"""
