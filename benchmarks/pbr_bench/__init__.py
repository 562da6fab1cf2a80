"""Benchmark harness (spec §4): data loaders, metrics, baselines. Not imported by pbr_core itself.

A top-level package of the source checkout, beside the library and not in its wheel; run it as
``python -m pbr_bench ...`` from the repository root.

- :mod:`pbr_bench.datasets`: PersonaBench, LoCoMo and PrefEval in one shape
  (``Dataset`` → per-user ``UserCorpus`` + ``Query`` with gold ids), and the PBR authors' cached
  generations.
- :mod:`pbr_bench.metrics`: Recall/NDCG/hit/MRR and PersonaBench's best-over-combinations rule.
- :mod:`pbr_bench.embed`: the offline all-MiniLM-L6-v2 encoder and an on-disk embedding cache.
- :mod:`pbr_bench.bm25`: the BM25 baseline (``bm25s``).
- ``python -m pbr_bench.check_baselines``: plain dense and BM25 against published numbers.
"""
