"""P-Anchor (spec §2.3): the centrality-weighted centre of one user's history.

A sparse directed kNN cosine graph over the history vectors, PageRank on it, and the
PageRank-weighted mean of the vectors. The graph is built with faiss (exact up to
``exact_max_items``, HNSW above) and stored as a scipy CSR matrix: memory is O(n·k2), never n².
"""

from __future__ import annotations

from dataclasses import dataclass

import faiss
import numpy as np
import scipy.sparse as sp

from .config import PBRConfig


@dataclass(frozen=True)
class AnchorResult:
    """The anchor of one history version.

    Attributes:
        vector: ``c_anchor = Σ π_i c_i`` (not re-normalised), shape ``(d,)``.
        pagerank: ``π``, non-negative, sums to 1, shape ``(n,)``.
        graph: the weighted kNN graph (row i = node i's kept neighbours, self included).
        iterations: power-iteration steps taken.
        converged: whether ``‖Δπ‖₂`` fell below the tolerance before the step cap.
    """

    vector: np.ndarray
    pagerank: np.ndarray
    graph: sp.csr_matrix
    iterations: int
    converged: bool

    def top_items(self, count: int) -> list[tuple[int, float]]:
        """Indices and PageRank of the ``count`` most central history items, most central first."""
        order = np.argsort(-self.pagerank, kind="stable")[:count]
        return [(int(i), float(self.pagerank[i])) for i in order]


def knn_search(
    vectors: np.ndarray, k: int, *, exact_max_items: int = 50_000
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` inner-product neighbours of every row among all rows (self included).

    Exact (flat index) for ``n <= exact_max_items``, HNSW otherwise. Returns ``(sims, ids)``,
    both ``(n, k)``; missing neighbours (approximate search) have id ``-1``.
    """
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    n, d = x.shape
    k = min(k, n)
    if n <= exact_max_items:
        sims, ids = faiss.knn(x, x, k, metric=faiss.METRIC_INNER_PRODUCT)
        return sims, ids
    index = faiss.IndexHNSWFlat(d, 32, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = 80
    index.hnsw.efSearch = max(64, 2 * k)
    index.add(x)
    sims, ids = index.search(x, k)
    return sims, ids


def knn_graph(
    vectors: np.ndarray, theta: float, k2: int, *, exact_max_items: int = 50_000
) -> sp.csr_matrix:
    """The sparse kNN graph of spec §2.3, step 2.

    Node ``i`` keeps itself plus its ``k2 - 1`` most similar other nodes whose cosine is at least
    ``theta`` (and positive, so that edge weights can be row-normalised); edge weight = cosine.
    The self-loop is forced, so every row is non-empty even when duplicates tie with self.

    Args:
        vectors: ``(n, d)`` unit rows.
        theta: similarity threshold.
        k2: neighbours per node, the node itself counted.
    """
    n = vectors.shape[0]
    if n == 0:
        return sp.csr_matrix((0, 0), dtype=np.float64)
    # One extra neighbour so that k2 - 1 *others* remain when self shows up in the list.
    sims, ids = knn_search(vectors, min(k2 + 1, n), exact_max_items=exact_max_items)
    others = (ids != np.arange(n)[:, None]) & (ids >= 0) & (sims >= theta) & (sims > 0)
    others &= np.cumsum(others, axis=1) <= k2 - 1  # the k2 - 1 most similar others
    row_idx, col_pos = np.nonzero(others)
    self_sim = np.einsum("ij,ij->i", vectors, vectors)
    rows = np.concatenate((np.arange(n), row_idx))
    cols = np.concatenate((np.arange(n), ids[row_idx, col_pos]))
    vals = np.concatenate((self_sim, sims[row_idx, col_pos])).astype(np.float64)
    graph = sp.csr_matrix((vals, (rows, cols)), shape=(n, n))
    graph.sort_indices()
    return graph


def row_normalize(graph: sp.csr_matrix) -> sp.csr_matrix:
    """Row-stochastic transition matrix ``P`` from non-negative edge weights."""
    sums = np.asarray(graph.sum(axis=1)).ravel()
    if (sums <= 0).any():
        raise ValueError("every node needs an outgoing edge of positive weight (a self-loop)")
    return sp.csr_matrix(sp.diags(1.0 / sums) @ graph)


def pagerank(
    graph: sp.csr_matrix,
    *,
    alpha: float = 0.85,
    tol: float = 1e-6,
    max_iter: int = 50,
    start: np.ndarray | None = None,
) -> tuple[np.ndarray, int, bool]:
    """PageRank by power iteration: ``π ← α Pᵀ π + (1 − α)/n · 1`` (spec §2.3, step 3).

    Starts from the uniform vector (or ``start``, for a warm restart after a small history
    change) and stops when ``‖Δπ‖₂ < tol`` or after ``max_iter`` steps; ``π`` is then divided by
    its sum. With ``alpha = 1`` this is the authors' plain power iteration, whose result on a
    disconnected graph depends on the start and on the step cap.

    Returns:
        ``(π, iterations, converged)``.
    """
    n = graph.shape[0]
    if n == 0:
        return np.zeros(0), 0, True
    transition_t = row_normalize(graph).T.tocsr()
    pi = np.full(n, 1.0 / n) if start is None else np.asarray(start, dtype=np.float64).copy()
    teleport = (1.0 - alpha) / n
    converged = False
    steps = 0
    for steps in range(1, max_iter + 1):  # noqa: B007 - steps is reported
        new = alpha * (transition_t @ pi) + teleport
        delta = float(np.linalg.norm(new - pi))
        pi = new
        if delta < tol:
            converged = True
            break
    return pi / pi.sum(), steps, converged


def compute_anchor(
    vectors: np.ndarray, config: PBRConfig, *, start: np.ndarray | None = None
) -> AnchorResult | None:
    """The anchor of a history; ``None`` for fewer than 2 items (spec §2.5: no anchor)."""
    n = vectors.shape[0]
    if n < 2:
        return None
    graph = knn_graph(vectors, config.theta, config.k2, exact_max_items=config.exact_knn_max_items)
    return anchor_from_graph(vectors, graph, config, start=start)


def anchor_from_graph(
    vectors: np.ndarray, graph: sp.csr_matrix, config: PBRConfig, *, start: np.ndarray | None = None
) -> AnchorResult:
    """PageRank on a ready graph and the weighted mean of the vectors."""
    pi, steps, converged = pagerank(
        graph,
        alpha=config.alpha,
        tol=config.pagerank_tol,
        max_iter=config.pagerank_max_iter,
        start=start,
    )
    vector = (pi @ vectors.astype(np.float64)).astype(np.float32)
    return AnchorResult(
        vector=vector, pagerank=pi, graph=graph, iterations=steps, converged=converged
    )
