"""The harness's two search protocols: dense (the paper's, the committed results) and hybrid (the
library's default search, run through ``Personalizer.search`` itself)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_bench_prefill import BatchingGenerator, make_bench

from pbr_bench.cli import build_parser
from pbr_bench.runner import Bench
from pbr_core import PBRConfig


def test_hybrid_rankings_are_the_librarys_own_search(tmp_path: Path) -> None:
    bench = make_bench(tmp_path, BatchingGenerator())
    bench.search = "hybrid"
    for method, fusion in (("plain", "plain"), ("pbr-safe", "safe")):
        run = bench.run(method, progress=False)
        assert run.method == f"{method}+hybrid"
        cfg = PBRConfig(fusion=fusion, search="hybrid")
        for q in bench.queries:
            found = bench.personalizer.search(q.user_id, q.text, bench.k, config=cfg)
            assert run.rankings[q.id] == [h.id for h in found.hits]


def test_the_lexical_leg_reaches_the_harness_only_in_hybrid_mode(tmp_path: Path) -> None:
    bench = make_bench(tmp_path, BatchingGenerator())
    # 4-d length/vowel vectors put "street tacos" nearest; only BM25 sees the words themselves.
    question = next(q for q in bench.queries if q.user_id == "ben")
    object.__setattr__(question, "text", "ghost")
    dense = bench.run("plain", progress=False).rankings[question.id]
    bench.search = "hybrid"
    hybrid = bench.run("plain", progress=False).rankings[question.id]
    assert dense[0] != "ben1"
    assert hybrid[0] == "ben1"
    assert sorted(dense) == sorted(hybrid)


def test_methods_that_rank_densely_keep_their_names_and_an_unknown_search_is_refused(
    tmp_path: Path,
) -> None:
    bench = make_bench(tmp_path, BatchingGenerator())
    bench.search = "hybrid"
    assert bench.run("bm25", progress=False).method == "bm25"
    assert bench.run("hyde", progress=False).method == "hyde"  # an LLM baseline: dense search
    with pytest.raises(ValueError, match="'dense' or 'hybrid'"):
        Bench(bench.ds, search="lexical", embeddings=bench.embedder.cache)  # type: ignore[arg-type]


def test_the_cli_defaults_to_the_papers_protocol() -> None:
    assert build_parser().parse_args(["run"]).search == "dense"
    assert build_parser().parse_args(["run", "--search", "hybrid"]).search == "hybrid"
