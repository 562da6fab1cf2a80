"""P-Anchor (spec §2.3): kNN graph, PageRank and the anchor, against hand and independent math."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from pbr_core import PBRConfig, compute_anchor, knn_graph, pagerank

# Unit vectors at 0°, 30°, 90° and 180°: cosines 0.866 (a,b), 0.5 (b,c), 0 (a,c), -1 (a,d) ...
A, B, C, D = (
    [1.0, 0.0],
    [np.cos(np.pi / 6), np.sin(np.pi / 6)],
    [0.0, 1.0],
    [-1.0, 0.0],
)
FOUR = np.array([A, B, C, D], dtype=np.float32)
COS30 = float(np.cos(np.pi / 6))


def dense(graph) -> np.ndarray:
    return np.asarray(graph.todense())


def test_knn_rows_keep_self_plus_best_others_above_theta() -> None:
    got = dense(knn_graph(FOUR, theta=0.4, k2=2))
    want = np.array(
        [
            [1.0, COS30, 0.0, 0.0],  # a: self + b
            [COS30, 1.0, 0.0, 0.0],  # b: self + a (c, at 0.5, is cut by k2)
            [0.0, 0.5, 1.0, 0.0],  # c: self + b
            [0.0, 0.0, 0.0, 1.0],  # d: nothing reaches theta, self only
        ]
    )
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_k2_counts_the_node_itself() -> None:
    got = dense(knn_graph(FOUR, theta=0.4, k2=3))
    np.testing.assert_allclose(got[1], [COS30, 1.0, 0.5, 0.0], atol=1e-6)
    assert (got > 0).sum(axis=1).max() <= 3
    assert (dense(knn_graph(FOUR, theta=0.4, k2=1)) > 0).sum() == 4  # self-loops only


def test_theta_filters_edges() -> None:
    got = dense(knn_graph(FOUR, theta=0.9, k2=4))
    np.testing.assert_allclose(got, np.eye(4), atol=1e-6)


def test_duplicates_do_not_push_self_out_of_its_row() -> None:
    dup = np.array([A, A, A, C], dtype=np.float32)
    got = dense(knn_graph(dup, theta=0.5, k2=2))
    assert np.all(np.diag(got) == pytest.approx(1.0))
    assert ((got > 0).sum(axis=1) == [2, 2, 2, 1]).all()


def closed_form_pagerank(graph: np.ndarray, alpha: float) -> np.ndarray:
    """π = (1 − α)/n · (I − α Pᵀ)⁻¹ 1, the fixed point of the damped iteration."""
    n = graph.shape[0]
    p = graph / graph.sum(axis=1, keepdims=True)
    pi = np.linalg.solve(np.eye(n) - alpha * p.T, np.full(n, (1 - alpha) / n))
    return pi / pi.sum()


def test_damped_pagerank_matches_the_closed_form() -> None:
    graph = knn_graph(FOUR, theta=0.4, k2=3)
    got, steps, converged = pagerank(graph, alpha=0.85, tol=1e-12, max_iter=10_000)
    assert converged and steps > 1
    np.testing.assert_allclose(got, closed_form_pagerank(dense(graph), 0.85), atol=1e-9)


def test_undamped_pagerank_is_the_stationary_eigenvector_on_a_connected_graph() -> None:
    three = np.array([A, B, C], dtype=np.float32)  # a–b–c connected at theta 0.4
    graph = knn_graph(three, theta=0.4, k2=3)
    got, _, converged = pagerank(graph, alpha=1.0, tol=1e-12, max_iter=10_000)
    p = dense(graph) / dense(graph).sum(axis=1, keepdims=True)
    values, vectors = np.linalg.eig(p.T)
    stationary = np.real(vectors[:, np.argmin(np.abs(values - 1.0))])
    assert converged
    np.testing.assert_allclose(got, stationary / stationary.sum(), atol=1e-8)


def test_undamped_pagerank_stops_at_the_step_cap_like_the_authors_code() -> None:
    graph = knn_graph(FOUR, theta=0.4, k2=2)
    p = dense(graph) / dense(graph).sum(axis=1, keepdims=True)
    pi = np.full(4, 0.25)
    for _ in range(3):
        pi = p.T @ pi
    got, steps, _ = pagerank(graph, alpha=1.0, tol=1e-30, max_iter=3)
    assert steps == 3
    np.testing.assert_allclose(got, pi / pi.sum(), atol=1e-12)


def test_anchor_is_the_pagerank_weighted_mean() -> None:
    cfg = PBRConfig(theta=0.4, k2=3, alpha=0.85, pagerank_tol=1e-12, pagerank_max_iter=10_000)
    result = compute_anchor(FOUR, cfg)
    assert result is not None
    pi = closed_form_pagerank(dense(result.graph), 0.85)
    np.testing.assert_allclose(result.vector, pi @ FOUR, atol=1e-6)
    assert result.top_items(1)[0][0] == int(np.argmax(pi))


def test_no_anchor_below_two_items() -> None:
    assert compute_anchor(np.zeros((0, 4), dtype=np.float32), PBRConfig()) is None
    assert compute_anchor(FOUR[:1], PBRConfig()) is None


def test_approximate_graph_agrees_with_exact_on_clustered_data() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    exact = knn_graph(x, theta=0.1, k2=5)
    approx = knn_graph(x, theta=0.1, k2=5, exact_max_items=10)  # forces HNSW
    agree = (dense(exact) > 0) & (dense(approx) > 0)
    assert agree.sum() / (dense(exact) > 0).sum() > 0.95


unit_rows = arrays(
    np.float32,
    st.tuples(st.integers(2, 12), st.integers(2, 6)),
    elements=st.floats(-1, 1, width=32),
).filter(lambda x: (np.linalg.norm(x, axis=1) > 1e-3).all())


def normalise(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def reference_graph(x: np.ndarray, theta: float, k2: int) -> np.ndarray:
    """The kNN graph from the dense similarity matrix, by the spec's words."""
    sims = x @ x.T
    n = len(x)
    out = np.zeros((n, n))
    for i in range(n):
        out[i, i] = sims[i, i]
        others = [j for j in np.argsort(-sims[i], kind="stable") if j != i]
        kept = [j for j in others if sims[i, j] >= theta and sims[i, j] > 0][: k2 - 1]
        out[i, kept] = sims[i, kept]
    return out


@settings(max_examples=60, deadline=None)
@given(unit_rows, st.floats(0.0, 0.95), st.integers(1, 6))
def test_sparse_graph_equals_the_dense_construction(x, theta, k2) -> None:
    x = normalise(x)
    got = dense(knn_graph(x, theta=theta, k2=k2))
    want = reference_graph(x, theta, k2)
    # Ties in similarity may pick a different (equally similar) neighbour: compare row sums and
    # the multiset of kept similarities, which ties cannot change.
    np.testing.assert_allclose(np.sort(got, axis=1), np.sort(want, axis=1), atol=1e-5)


@settings(max_examples=60, deadline=None)
@given(unit_rows, st.floats(0.0, 0.95), st.integers(1, 6), st.sampled_from([0.85, 1.0]))
def test_pagerank_is_a_distribution_and_the_anchor_lies_in_the_hull(x, theta, k2, alpha) -> None:
    x = normalise(x)
    cfg = PBRConfig(theta=theta, k2=k2, alpha=alpha)
    result = compute_anchor(x, cfg)
    assert result is not None
    assert (result.pagerank >= 0).all()
    assert result.pagerank.sum() == pytest.approx(1.0)
    directions = np.random.default_rng(1).normal(size=(32, x.shape[1]))
    proj_anchor = directions @ result.vector
    proj_items = directions @ x.T
    assert (proj_anchor <= proj_items.max(axis=1) + 1e-5).all()
    assert (proj_anchor >= proj_items.min(axis=1) - 1e-5).all()
