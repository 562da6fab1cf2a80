"""Embedding cache, dense ranking and BM25 of the harness, on fake encoders (no model loaded)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pbr_bench.bm25 import BM25Index, bm25_rank
from pbr_bench.embed import EmbeddingCache, dense_rank


class CountingEncoder:
    """Deterministic 4-d vectors from the text's length and vowels; records every call."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, texts: list[str], batch_size: int) -> np.ndarray:
        self.calls.append(list(texts))
        return np.array(
            [[len(t), sum(c in "aeiou" for c in t), 1.0, t.count(" ")] for t in texts],
            dtype=np.float64,
        )


def test_cache_encodes_each_text_once_and_returns_unit_float32(tmp_path: Path) -> None:
    enc = CountingEncoder()
    cache = EmbeddingCache("fake", enc, cache_dir=tmp_path)
    first = cache.encode(["a cat", "a dog", "a cat"])
    assert first.shape == (3, 4) and first.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(first[0], first[2])
    assert enc.calls == [["a cat", "a dog"]]  # missing texts, de-duplicated, one call
    cache.encode(["a dog", "an owl"])
    assert enc.calls[-1] == ["an owl"]


def test_cache_persists_across_instances_and_compacts(tmp_path: Path) -> None:
    a = EmbeddingCache("fake", CountingEncoder(), cache_dir=tmp_path)
    want = np.concatenate([a.encode(["one"]), a.encode(["two"]), a.encode(["three"])])
    assert len(list(a.dir.glob("*.npz"))) == 3
    a.compact()
    assert len(list(a.dir.glob("*.npz"))) == 1
    b = EmbeddingCache("fake", None, cache_dir=tmp_path)  # no encoder: must be served from disk
    np.testing.assert_array_equal(b.encode(["one", "two", "three"]), want)
    with pytest.raises(RuntimeError, match=r"not cached .* no encoder"):
        b.encode(["four"])


def test_cache_is_keyed_by_model(tmp_path: Path) -> None:
    EmbeddingCache("model-a", CountingEncoder(), cache_dir=tmp_path).encode(["x"])
    enc = CountingEncoder()
    EmbeddingCache("model-b", enc, cache_dir=tmp_path).encode(["x"])
    assert enc.calls == [["x"]]


def test_empty_input_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="empty"):
        EmbeddingCache("fake", CountingEncoder(), cache_dir=tmp_path).encode([])


def test_dense_rank_is_batch_first_and_caps_k() -> None:
    docs = np.eye(3, dtype=np.float32)
    queries = np.array([[0.1, 0.9, 0.0], [1.0, 0.0, 0.5]], dtype=np.float32)
    assert dense_rank(docs, ["a", "b", "c"], queries, k=2) == [["b", "a"], ["a", "c"]]
    assert dense_rank(docs, ["a", "b", "c"], queries[0], k=10) == [["b", "a", "c"]]


def test_bm25_ranks_by_term_overlap_and_handles_unknown_terms() -> None:
    index = BM25Index(
        ["d1", "d2", "d3"], ["the cat sat on the mat", "dogs are loyal pets", "a cat and a dog"]
    )
    assert index.search(["cat mat"], k=2) == [["d1", "d3"]]
    assert index.scores(["zebra"]).tolist() == [[0.0, 0.0, 0.0]]
    assert index.search(["zebra"], k=5) == [["d1", "d2", "d3"]]  # ties keep corpus order
    assert bm25_rank(["x"], ["hello world"], ["hello", "bye"], k=3) == [["x"], ["x"]]


def test_bm25_rejects_bad_corpora() -> None:
    with pytest.raises(ValueError, match="empty corpus"):
        BM25Index([], [])
    with pytest.raises(ValueError, match="2 ids but 1 texts"):
        BM25Index(["a", "b"], ["only one"])


def test_a_scripts_scratch_folder_is_named_for_its_code_and_its_data(tmp_path, monkeypatch) -> None:
    """Scratch pickles were named for the script alone, so a changed default, grid or data set
    was served the rows computed before the change."""
    from pbr_bench.paths import scratch_dir

    monkeypatch.setenv("PBR_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "data"
    (data / "set").mkdir(parents=True)
    (data / "set" / "a.json").write_text("[1]")
    monkeypatch.setenv("PBR_DATA_DIR", str(data))
    script = tmp_path / "lead.py"
    script.write_text("GRID = [1, 2]\n")

    first = scratch_dir("lead", script)
    assert first.parent == tmp_path / "cache" and first.name.startswith("lead-")
    assert scratch_dir("lead", script) == first  # the same code on the same data: read back
    script.write_text("GRID = [1, 2, 3]\n")
    grid_changed = scratch_dir("lead", script)
    (data / "set" / "a.json").write_text("[1, 2]")
    data_changed = scratch_dir("lead", script)
    assert len({first, grid_changed, data_changed}) == 3
