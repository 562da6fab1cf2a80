"""Test doubles that tests in more than one folder share (fakes isolate a unit, nothing more).

``tests/`` is on ``sys.path`` for every test (pytest's rootdir conftest), so ``from doubles import
...`` works from any folder; a test never imports another test module across folders.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np
from langchain_core.embeddings import Embeddings

from pbr_core.salience import TokenLogProbs

DIM = 256


class BagOfWords(Embeddings):
    """A deterministic bag-of-words embedder (hashed words); counts what it embeds."""

    def __init__(self) -> None:
        self.documents = 0
        self.queries = 0

    @staticmethod
    def vector(text: str) -> list[float]:
        v = np.zeros(DIM, dtype=np.float64)
        for word in re.findall(r"\w+", text.lower()):
            h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "big")
            v[h % DIM] += 1.0
        v[0] += 0.01  # no zero vector
        return list(v / np.linalg.norm(v))

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.documents += len(texts)
        return [self.vector(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        self.queries += 1
        return self.vector(text)


class SecretScorer:
    """log p(target | context) = −20, +5 when the context holds "secret"; counts its calls."""

    model_id = "test/secret"

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def logprobs(
        self,
        contexts: Sequence[str],
        targets: Sequence[str],
        conditions: Sequence[str] | None = None,
    ) -> list[TokenLogProbs]:
        self.calls.append(list(contexts))
        return [TokenLogProbs(-20.0 + 5.0 * ("secret" in c), 4) for c in contexts]
