"""P-Anchor (spec §2.3): the centrality-weighted centre of one user's history.

A sparse directed kNN cosine graph over the history vectors, PageRank on it, and the
PageRank-weighted mean of the vectors. The graph is built with faiss (exact up to
``exact_max_items``, an IVF index above) and stored as a scipy CSR matrix: memory is O(n·k2),
never n².

When a history changes a little, :func:`update_anchor` derives the new anchor from the previous
one: only the graph rows the change can affect are recomputed, and PageRank restarts from the
previous ``π``. The result equals a full rebuild: the graph up to ties between equally similar
neighbours, the anchor up to PageRank's stopping error (each run stops at a step smaller than
``tol``, about ``α/(1−α)·tol`` from the fixed point, so a warm and a cold start differ by up to
twice that: ~1e-5 in π at α = .85 over 100 random histories, one item added to each).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Literal

import faiss
import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from .config import PBRConfig

ApproximateKnn = Literal["ivf", "hnsw"]

#: IVF parameters of the approximate kNN (see :func:`knn_search`): ``nlist = IVF_LISTS_PER_ROOT_N
#: · √n`` inverted lists, each row probes its ``IVF_NPROBE`` nearest lists; k-means is trained on
#: ``IVF_TRAIN_PER_LIST`` sampled rows per list for ``IVF_TRAIN_ITERATIONS`` steps. Measured on
#: clustered 384-d data in ``benchmarks/perf.py`` (docs/performance.md, "Anchor build").
IVF_LISTS_PER_ROOT_N = 4.0
IVF_NPROBE = 8
IVF_TRAIN_PER_LIST = 8
IVF_TRAIN_ITERATIONS = 4
IVF_MIN_LIST_SIZE = 64

#: An incremental update searches each changed row exactly against all ``n`` rows; an exact full
#: rebuild searches all ``n`` rows the same way. Above this share of changed rows the full rebuild
#: is about as cheap, and it is what :func:`update_anchor` does then.
INCREMENTAL_MAX_SHARE = 0.5
#: Above ``exact_knn_max_items`` the full rebuild is approximate, costing about as much as exactly
#: searching ``c · √n`` rows; :func:`update_anchor` rebuilds when more rows than that change.
INCREMENTAL_MAX_ROWS_PER_ROOT_N = 20.0


@dataclass(frozen=True)
class AnchorResult:
    """The anchor of one history version.

    Attributes:
        vector: ``c_anchor = Σ π_i c_i`` (not re-normalised), shape ``(d,)``.
        pagerank: ``π``, non-negative, sums to 1, shape ``(n,)``.
        graph: the weighted kNN graph (row i = node i's kept neighbours, self included).
        iterations: power-iteration steps taken.
        converged: whether ``‖Δπ‖₂`` fell below the tolerance before the step cap.
        rows_searched: graph rows computed by a kNN search (``n`` for a full build; for an
            incremental update, the new rows and those that lost a neighbour).
        rows_merged: graph rows of an incremental update that kept their neighbours and only
            merged in new, more similar ones (0 for a full build).
        warm_start: whether PageRank started from the previous version's ``π``.
    """

    vector: np.ndarray
    pagerank: np.ndarray
    graph: sp.csr_matrix
    iterations: int
    converged: bool
    rows_searched: int = 0
    rows_merged: int = 0
    warm_start: bool = False

    @cached_property
    def nbytes(self) -> int:
        """Bytes this anchor holds: its arrays, the graph's (CSR data, indices, pointers) and
        the ranking it sorts on first use (counted from the start: it is immutable)."""
        graph = self.graph
        held = self.vector.nbytes + 2 * self.pagerank.nbytes  # π and its int64 ranking
        return held + graph.data.nbytes + graph.indices.nbytes + graph.indptr.nbytes

    @cached_property
    def _ranking(self) -> np.ndarray:
        # Sorted once per anchor, not once per query, on π to RANKING_DIGITS significant
        # digits (ties: lower index first): a warm-started PageRank stops within its tolerance
        # of the fixed point, so items tied exactly there (isolated items, symmetric pairs) come
        # out ~1e-8 apart in an order a rebuild would not give.
        pi = self.pagerank
        top = float(pi.max()) if pi.size else 0.0
        if top <= 0:
            return np.arange(pi.size)
        return np.argsort(-np.round(pi / top, RANKING_DIGITS), kind="stable")

    def top_items(self, count: int) -> list[tuple[int, float]]:
        """Indices and PageRank of the ``count`` most central history items, most central first."""
        pi = self.pagerank
        return [(int(i), float(pi[i])) for i in self._ranking[: max(count, 0)]]


#: The significant digits (of π over its maximum) :meth:`AnchorResult.top_items` orders by.
RANKING_DIGITS = 4


# -- kNN search ----------------------------------------------------------------------------------
def knn_search(
    vectors: np.ndarray,
    k: int,
    *,
    exact_max_items: int = 10_000,
    approximate: ApproximateKnn = "ivf",
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` inner-product neighbours of every row among all rows (self included).

    Exact (faiss brute force, BLAS) for ``n <= exact_max_items``; above it an approximate
    index: ``"ivf"`` (default; an inverted file whose k-means is trained on a sample, far cheaper
    to build than HNSW on few cores) or ``"hnsw"``. Returns ``(sims, ids)``, both ``(n, k)``;
    missing neighbours (approximate search) have id ``-1``.
    """
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    n = x.shape[0]
    k = min(k, n)
    if n <= exact_max_items:
        sims, ids = faiss.knn(x, x, k, metric=faiss.METRIC_INNER_PRODUCT)
        return sims, ids
    if approximate == "hnsw":
        return _hnsw_knn(x, k)
    if approximate == "ivf":
        return _ivf_knn(x, k)
    raise ValueError(f"approximate must be 'ivf' or 'hnsw', got {approximate!r}")


def _hnsw_knn(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    index = faiss.IndexHNSWFlat(x.shape[1], 32, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = 80
    index.hnsw.efSearch = max(64, 2 * k)
    index.add(x)
    sims, ids = index.search(x, k)
    return sims, ids


def _ivf_knn(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """All-rows approximate kNN with an inverted file (IVF), joined list by list.

    k-means on a sample places ``nlist ≈ 4√n`` centroids; one search of the centroids gives each
    row its list (the nearest centroid) and the ``nprobe`` lists it probes. Then, per list, the
    rows that probe it are scored against the list's members in one BLAS product (faiss's flat
    kNN, which keeps the top ``k`` on the fly), and each row keeps the best ``k`` over its
    ``nprobe`` lists. The work is the IVF search's (``n · nprobe · n/nlist`` dot products) done
    as dense products, a few times faster than scanning list by list. Per-list products are too
    small to share between cores, so lists are spread over worker threads that each run faiss
    single-threaded (OpenMP's thread count is per thread): no thread waits on another, which on
    a busy machine is what makes small multi-threaded BLAS calls ten times slower.
    """
    n, d = x.shape
    # Lists of fewer than IVF_MIN_LIST_SIZE rows save little over scanning them all.
    nlist = max(1, min(n // IVF_MIN_LIST_SIZE, round(IVF_LISTS_PER_ROOT_N * np.sqrt(n))))
    nprobe = min(IVF_NPROBE, nlist)
    rng = np.random.default_rng(0)
    n_train = min(n, IVF_TRAIN_PER_LIST * nlist)
    sample = x[np.sort(rng.choice(n, n_train, replace=False))]
    kmeans = faiss.Kmeans(d, nlist, niter=IVF_TRAIN_ITERATIONS, spherical=True, seed=1234)
    kmeans.cp.min_points_per_centroid = 1  # a small sample is enough to place the lists
    kmeans.train(sample)
    del sample
    centroids = kmeans.centroids
    assert centroids is not None  # set by train()
    quantizer = faiss.IndexFlatIP(d)
    quantizer.add(centroids)
    _, probes = quantizer.search(x, nprobe)  # (n, nprobe), nearest list first

    primary = probes[:, 0]
    members_order = np.argsort(primary, kind="stable")
    members_bounds = np.searchsorted(primary[members_order], np.arange(nlist + 1))
    flat = probes.ravel()
    probe_order = np.argsort(flat, kind="stable")
    probe_bounds = np.searchsorted(flat[probe_order], np.arange(nlist + 1))
    del flat, primary, probes
    part_sims = np.full((n, nprobe, k), -np.inf, dtype=np.float32)
    part_ids = np.full((n, nprobe, k), -1, dtype=np.int32 if n < 2**31 else np.int64)

    def join(lists: range) -> None:
        faiss.omp_set_num_threads(1)  # this worker thread only
        for lst in lists:
            members = members_order[members_bounds[lst] : members_bounds[lst + 1]]
            probing = probe_order[probe_bounds[lst] : probe_bounds[lst + 1]]
            if members.size == 0 or probing.size == 0:
                continue
            rows, slots = probing // nprobe, probing % nprobe
            kk = min(k, members.size)
            sims, ids = faiss.knn(x[rows], x[members], kk, metric=faiss.METRIC_INNER_PRODUCT)
            part_sims[rows, slots, :kk] = sims
            part_ids[rows, slots, :kk] = members[ids]

    workers = max(1, min(os.cpu_count() or 1, faiss.omp_get_max_threads()))
    step = max(1, -(-nlist // (workers * 8)))  # a few batches per worker, for balance
    batches = [range(i, min(i + step, nlist)) for i in range(0, nlist, step)]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pbr-ivf") as pool:
        list(pool.map(join, batches))

    cand_sims = part_sims.reshape(n, nprobe * k)
    cand_ids = part_ids.reshape(n, nprobe * k)
    sims, ids = _top_k_per_row(cand_sims, k, cand_ids)
    return sims, ids.astype(np.int64)


def _top_k_per_row(
    scores: np.ndarray, k: int, ids: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest scores of each row, best first, and their ids (``ids[row, column]``, or
    the column itself when ``ids`` is None). O(columns) selection, then a sort of ``k``."""
    if k < scores.shape[1]:
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    else:
        top = np.broadcast_to(np.arange(scores.shape[1]), scores.shape)
    top_scores = np.take_along_axis(scores, top, axis=1)
    order = np.argsort(-top_scores, axis=1, kind="stable")
    chosen = np.take_along_axis(top, order, axis=1)
    if ids is not None:
        chosen = np.take_along_axis(ids, chosen, axis=1)
    return np.take_along_axis(top_scores, order, axis=1), chosen


# -- the graph -----------------------------------------------------------------------------------
def _select_neighbours(
    rows: np.ndarray,
    sims: np.ndarray,
    ids: np.ndarray,
    self_sim: np.ndarray,
    theta: float,
    k2: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """COO entries of graph rows ``rows`` from their search results (best first).

    Row ``rows[r]`` keeps itself (weight ``self_sim[r]``) plus the ``k2 - 1`` most similar
    *other* ids whose similarity is at least ``theta`` and positive. The one rule for full
    builds and incremental updates, so that both give the same graph.
    """
    others = (ids != rows[:, None]) & (ids >= 0) & (sims >= theta) & (sims > 0)
    others &= np.cumsum(others, axis=1) <= k2 - 1  # the k2 - 1 most similar others
    r_pos, c_pos = np.nonzero(others)
    out_rows = np.concatenate((rows, rows[r_pos]))
    out_cols = np.concatenate((rows, ids[r_pos, c_pos]))
    out_vals = np.concatenate((self_sim, sims[r_pos, c_pos])).astype(np.float64)
    return out_rows, out_cols, out_vals


def _self_similarity(vectors: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", vectors, vectors)


def _csr(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, n: int) -> sp.csr_matrix:
    graph = sp.csr_matrix((vals, (rows, cols)), shape=(n, n))
    graph.sort_indices()
    return graph


def knn_graph(
    vectors: np.ndarray,
    theta: float,
    k2: int,
    *,
    exact_max_items: int = 10_000,
    approximate: ApproximateKnn = "ivf",
) -> sp.csr_matrix:
    """The sparse kNN graph of spec §2.3, step 2.

    Node ``i`` keeps itself plus its ``k2 - 1`` most similar other nodes whose cosine is at least
    ``theta`` (and positive, so that edge weights can be row-normalised); edge weight = cosine.
    The self-loop is forced, so every row is non-empty even when duplicates tie with self.

    Args:
        vectors: ``(n, d)`` unit rows.
        theta: similarity threshold.
        k2: neighbours per node, the node itself counted.
        exact_max_items: above this many rows the neighbours come from an approximate index.
        approximate: which approximate index (see :func:`knn_search`).
    """
    n = vectors.shape[0]
    if n == 0:
        return sp.csr_matrix((0, 0), dtype=np.float64)
    # One extra neighbour so that k2 - 1 *others* remain when self shows up in the list.
    sims, ids = knn_search(
        vectors, min(k2 + 1, n), exact_max_items=exact_max_items, approximate=approximate
    )
    rows, cols, vals = _select_neighbours(
        np.arange(n), sims, ids, _self_similarity(vectors), theta, k2
    )
    return _csr(rows, cols, vals, n)


@dataclass(frozen=True)
class GraphUpdate:
    """A kNN graph derived from a previous one, and what it cost.

    Attributes:
        graph: the new graph, equal to :func:`knn_graph` of the new vectors (up to ties).
        rows_searched: rows recomputed by an exact kNN search against all rows.
        rows_merged: rows that kept their neighbours and merged in new, more similar ones.
    """

    graph: sp.csr_matrix
    rows_searched: int
    rows_merged: int


def _check_positions(old_positions: np.ndarray, n: int, n_old: int) -> np.ndarray:
    pos = np.asarray(old_positions, dtype=np.int64)
    if pos.shape != (n,):
        raise ValueError(f"old_positions must have one entry per row ({n}), got {pos.shape}")
    kept = pos[pos >= 0]
    if (pos < -1).any() or (kept >= n_old).any() or np.bincount(kept, minlength=1).max() > 1:
        raise ValueError(
            f"old_positions must hold distinct positions in [0, {n_old}) or -1 for a new row"
        )
    return pos


def _similarities(x: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """``x @ queries.T`` for a few queries. ``einsum`` runs on the calling thread: for a
    matrix-vector sized product it beats a multi-threaded BLAS call, whose thread wake-ups cost
    more than the product on a busy machine."""
    if queries.shape[0] <= 8:
        return np.einsum("ij,kj->ik", x, queries)
    return x @ queries.T


def _rows_knn(x: np.ndarray, rows: np.ndarray, k: int, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` inner-product neighbours of ``x[rows]`` among all rows, best first."""
    if rows.size > chunk:
        sims, ids = faiss.knn(x[rows], x, k, metric=faiss.METRIC_INNER_PRODUCT)
        return sims, ids
    return _top_k_per_row(_similarities(x, x[rows]).T, k)  # scores (rows, n)


def update_graph(
    previous: sp.csr_matrix,
    vectors: np.ndarray,
    old_positions: np.ndarray,
    theta: float,
    k2: int,
    *,
    chunk: int = 256,
) -> GraphUpdate:
    """The kNN graph of ``vectors`` from the graph of a previous version of the same history.

    Rows are recomputed only where the change can reach them:

    * a new (or changed) row: exact kNN search of that row against all rows;
    * a kept row that had a removed node among its neighbours: the same search (its next-best
      neighbour is unknown);
    * a kept row that a new row now beats (similarity ≥ ``theta`` and above the row's weakest
      kept neighbour, or any similarity ≥ ``theta`` when the row has room): its kept neighbours
      merged with the new candidates, best ``k2 - 1`` kept. Exact, because the neighbours that
      the row dropped before are beaten by ones it still has.

    Every other row is copied from ``previous`` with its columns renumbered.

    Args:
        previous: the previous version's graph (same ``theta`` and ``k2``).
        vectors: ``(n, d)`` unit rows of the new version.
        old_positions: ``(n,)``: for each new row, its position in the previous version, or
            ``-1`` when the row is new or its vector changed (a removed node plus a new one).
        theta, k2: the graph parameters (spec §2.3).
        chunk: new rows per block when scoring new rows against kept rows (memory ``n · chunk``).
    """
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    n = x.shape[0]
    n_old = previous.shape[0]
    pos = _check_positions(old_positions, n, n_old)
    kept_new = np.flatnonzero(pos >= 0)
    fresh = np.flatnonzero(pos < 0)
    new_of_old = np.full(n_old, -1, dtype=np.int64)
    new_of_old[pos[kept_new]] = kept_new

    prev = previous.tocsr()
    counts = np.diff(prev.indptr)
    old_rows = np.repeat(np.arange(n_old), counts)
    old_cols = prev.indices.astype(np.int64)
    old_vals = prev.data
    is_self = old_rows == old_cols

    # Kept rows that lost a neighbour must be searched again.
    lost = np.zeros(n_old, dtype=bool)
    lost[old_rows[(new_of_old[old_cols] < 0) & ~is_self]] = True
    dirty_new = np.zeros(n, dtype=bool)
    dirty_new[new_of_old[lost & (new_of_old >= 0)]] = True
    dirty_new[fresh] = True
    searched = np.flatnonzero(dirty_new)

    # Clean kept rows: the weakest kept neighbour, and whether the row is full (k2 - 1 others).
    others_count = np.bincount(old_rows[~is_self], minlength=n_old)
    weakest = np.full(n_old, np.inf)
    np.minimum.at(weakest, old_rows[~is_self], old_vals[~is_self])
    clean = np.flatnonzero((pos >= 0) & ~dirty_new)
    clean_old = pos[clean]
    # A new row enters clean row i if its similarity exceeds bar[i] (+inf: not a clean row).
    bar = np.full(n, np.inf)
    bar[clean] = np.where(others_count[clean_old] >= k2 - 1, weakest[clean_old], -np.inf)

    # New rows that beat a clean row's weakest neighbour (or fill a row with room).
    cand_rows: list[np.ndarray] = []
    cand_cols: list[np.ndarray] = []
    cand_vals: list[np.ndarray] = []
    if k2 > 1 and fresh.size and clean.size:
        floor = max(theta, float(np.nextafter(np.float32(0), np.float32(1))))
        for start in range(0, fresh.size, chunk):
            block = fresh[start : start + chunk]
            s = _similarities(x, x[block])  # (n, block)
            r, c = np.nonzero((s >= floor) & (s > bar[:, None]))
            cand_rows.append(r)
            cand_cols.append(block[c])
            cand_vals.append(s[r, c].astype(np.float64))
    merge_rows = np.unique(np.concatenate(cand_rows)) if cand_rows else np.zeros(0, np.int64)

    # Entries copied from the previous graph: clean rows that merge nothing.
    row_new = new_of_old[old_rows]
    copy = row_new >= 0
    copy[copy] = ~dirty_new[row_new[copy]]
    is_merge = np.zeros(n, dtype=bool)
    is_merge[merge_rows] = True
    keep_as_is = copy.copy()
    keep_as_is[copy] = ~is_merge[row_new[copy]]
    parts_r = [row_new[keep_as_is]]
    parts_c = [new_of_old[old_cols[keep_as_is]]]
    parts_v = [old_vals[keep_as_is]]

    # Merged rows: self-loop as before, then the best k2 - 1 of old neighbours ∪ candidates.
    if merge_rows.size:
        merging = copy & ~keep_as_is
        m_self = merging & is_self
        parts_r.append(row_new[m_self])
        parts_c.append(row_new[m_self])
        parts_v.append(old_vals[m_self])
        m_other = merging & ~is_self
        pool_r = np.concatenate([row_new[m_other], *cand_rows])
        pool_c = np.concatenate([new_of_old[old_cols[m_other]], *cand_cols])
        pool_v = np.concatenate([old_vals[m_other], *cand_vals])
        order = np.lexsort((pool_c, -pool_v, pool_r))
        pool_r, pool_c, pool_v = pool_r[order], pool_c[order], pool_v[order]
        first = np.searchsorted(pool_r, pool_r, side="left")
        take = (np.arange(pool_r.size) - first) < k2 - 1
        parts_r.append(pool_r[take])
        parts_c.append(pool_c[take])
        parts_v.append(pool_v[take])

    # Searched rows: exact search against all rows, the same selection rule as a full build.
    if searched.size:
        sims, ids = _rows_knn(x, searched, min(k2 + 1, n), chunk)
        r, c, v = _select_neighbours(searched, sims, ids, _self_similarity(x[searched]), theta, k2)
        parts_r.append(r)
        parts_c.append(c)
        parts_v.append(v)

    graph = _csr(np.concatenate(parts_r), np.concatenate(parts_c), np.concatenate(parts_v), n)
    return GraphUpdate(
        graph=graph, rows_searched=int(searched.size), rows_merged=int(merge_rows.size)
    )


# -- PageRank and the anchor ---------------------------------------------------------------------
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
        diff = new - pi
        delta = float(np.sqrt(np.einsum("i,i->", diff, diff)))
        pi = new
        if delta < tol:
            converged = True
            break
    return pi / pi.sum(), steps, converged


def compute_anchor(
    vectors: np.ndarray,
    config: PBRConfig,
    *,
    start: np.ndarray | None = None,
    approximate: ApproximateKnn = "ivf",
) -> AnchorResult | None:
    """The anchor of a history; ``None`` for fewer than 2 items (spec §2.5: no anchor)."""
    n = vectors.shape[0]
    if n < 2:
        return None
    graph = knn_graph(
        vectors,
        config.theta,
        config.k2,
        exact_max_items=config.exact_knn_max_items,
        approximate=approximate,
    )
    result = anchor_from_graph(vectors, graph, config, start=start)
    return _with_stats(result, rows_searched=n, rows_merged=0, warm_start=start is not None)


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
    # float64 accumulation without a float64 copy of the vectors (3 GB for 1M × 384).
    vector = np.einsum("i,ij->j", pi, vectors).astype(np.float32)
    return AnchorResult(
        vector=vector, pagerank=pi, graph=graph, iterations=steps, converged=converged
    )


def update_anchor(
    previous: AnchorResult,
    vectors: np.ndarray,
    old_positions: np.ndarray,
    config: PBRConfig,
) -> AnchorResult | None:
    """The anchor of a changed history, derived from the previous version's anchor.

    The graph is updated row by row (:func:`update_graph`); when so many rows changed that a full
    build is about as cheap (:data:`INCREMENTAL_MAX_SHARE`, :data:`INCREMENTAL_MAX_ROWS_PER_ROOT_N`)
    it is rebuilt instead. Above ``config.exact_knn_max_items`` the full graph is approximate and
    the updated rows are exact, so the two differ by the approximation only. PageRank starts from
    the previous ``π`` (kept nodes keep their mass, new nodes get ``1/n``, renormalised) when
    ``alpha < 1``: the damped iteration has a unique fixed point, so the start only changes how
    many steps it takes, and the anchor stays within the stopping error of a cold start (about
    ``2α/(1−α)·tol``, module docstring; when the warm iteration hits the step cap before
    converging, it is redone cold). With
    ``alpha = 1`` it starts from the uniform vector, as a full build does: undamped power
    iteration on a disconnected graph converges to a start-dependent vector (or stops at the step
    cap), and the anchor must depend on the history's content, not on its edit path (a reloaded
    store, or another process, would otherwise compute a different anchor for the same items).

    Args:
        previous: the anchor of the previous version, for the same ``config.anchor_key``.
        vectors: ``(n, d)`` unit rows of the new version.
        old_positions: ``(n,)``: each row's position in the previous version, ``-1`` when new or
            changed.
        config: the method's parameters (its ``anchor_key`` must be the previous one's).
    """
    x = np.asarray(vectors)
    n = x.shape[0]
    if n < 2:
        return None
    n_old = previous.graph.shape[0]
    pos = _check_positions(old_positions, n, n_old)
    if n == n_old and np.array_equal(pos, np.arange(n)):
        return previous  # same rows, same vectors: the same anchor
    changed = int((pos < 0).sum()) + int(n_old - (pos >= 0).sum())
    limit = INCREMENTAL_MAX_SHARE * n
    if n > config.exact_knn_max_items:
        limit = min(limit, INCREMENTAL_MAX_ROWS_PER_ROOT_N * np.sqrt(n))
    if changed > limit:
        return compute_anchor(x, config)
    update = update_graph(previous.graph, x, pos, config.theta, config.k2)
    warm = config.alpha < 1.0
    if warm:
        result = anchor_from_graph(
            x, update.graph, config, start=_warm_start(previous.pagerank, pos, update.graph)
        )
        # Converged: within the tolerance of the unique fixed point, as a cold start would be.
        # Not converged within the step cap: the result would depend on the start, so redo it
        # cold and get exactly what a full build gives.
        warm = result.converged
    if not warm:
        result = anchor_from_graph(x, update.graph, config)
    return _with_stats(
        result,
        rows_searched=update.rows_searched,
        rows_merged=update.rows_merged,
        warm_start=warm,
    )


def _warm_start(
    previous_pi: np.ndarray, old_positions: np.ndarray, graph: sp.csr_matrix
) -> np.ndarray:
    """The previous ``π`` on the kept rows, ``1/n`` on new ones, rescaled per component.

    No walk leaves a weakly connected component ``C``, so the damped iteration started from the
    uniform vector keeps ``C``'s mass at ``|C|/n`` at every step, and so does its fixed point.
    The previous ``π`` has the old components' masses; a mass error between components decays
    only as ``αᵗ`` (slower than a cold start converges), so it is removed here up front.
    """
    n = old_positions.shape[0]
    start = np.full(n, 1.0 / n)
    kept = old_positions >= 0
    start[kept] = previous_pi[old_positions[kept]]
    _, labels = connected_components(graph, directed=True, connection="weak")
    mass = np.bincount(labels, weights=start)
    size = np.bincount(labels)
    return start * (size / n / mass)[labels]


def _with_stats(
    result: AnchorResult, *, rows_searched: int, rows_merged: int, warm_start: bool
) -> AnchorResult:
    return replace(
        result, rows_searched=rows_searched, rows_merged=rows_merged, warm_start=warm_start
    )
