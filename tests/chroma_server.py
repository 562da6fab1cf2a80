"""What both adapters' Chroma tests check against, beside the real server they start
(:class:`pbr_bench.chroma_server.ChromaServer`, shared with the benchmarks)."""

from __future__ import annotations

from typing import Any

from pbr_bench.chroma_server import ChromaServer

__all__ = [
    "HOSTILE_USER_IDS",
    "ChromaServer",
    "assert_collection_holds",
    "assert_history_matches_database",
    "brute_force_ids",
]


# -- what both adapters' Chroma tests check against ----------------------------------------------
#: User ids that try to break out of a metadata filter; each must be matched as a plain value.
HOSTILE_USER_IDS = (
    "$or",
    "$ne",
    '{"$ne": ""}',
    'x"}, {"user_id": {"$ne": ""}}',
    "bob' OR '1'='1",
    '{"$or": [{"user_id": "u00"}, {"user_id": {"$ne": "x"}}]}',
)


def brute_force_ids(vectors: Any, ids: list[str], query: Any, k: int) -> list[str]:
    """The ``k`` ids whose vectors have the largest cosine with ``query``: exact, best first."""
    import numpy as np

    rows = np.asarray(vectors, dtype=np.float64)
    rows = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    q = np.asarray(query, dtype=np.float64)
    scores = rows @ (q / np.linalg.norm(q))
    order = np.argsort(-scores, kind="stable")[:k]
    return [ids[i] for i in order]


def assert_collection_holds(collection: Any, store: Any, users: list[str], items: int) -> None:
    """The collection holds ``items`` rows per user, users' rows interleaved, the users' own ids
    (metadata ``pbr_id``) as in PBR's history ``store`` (a :class:`pbr_core.HistoryStore`)."""
    assert collection.count() == len(users) * items
    first = collection.get(limit=len(users) * 2, include=["metadatas"])
    assert len({m["user_id"] for m in first["metadatas"]}) > 1  # not one user after another
    for user in users[:5]:
        rows = collection.get(where={"user_id": user}, include=["metadatas"])
        stored = [m["pbr_id"] for m in rows["metadatas"]]  # the user's own id of each row
        assert sorted(stored) == sorted(it.id for it in store.get(user).items)


def assert_history_matches_database(
    collection: Any, history: Any, saved_anchor: Any, config: Any
) -> None:
    """PBR's history of one user agrees with the database after a restart.

    Same ids (nothing lost, nothing extra), same vectors (the database's rows, normalised, are the
    history's), and the anchor is both the one saved before the restart and the one computed
    afresh from the database's rows.
    """
    import numpy as np

    from pbr_core import HistoryStore

    ids = [it.id for it in history.items]
    db = collection.get(where={"user_id": history.user_id}, include=["embeddings", "metadatas"])
    own_ids = [m["pbr_id"] for m in db["metadatas"]]  # keys are scoped; the user's ids ride along
    assert sorted(own_ids) == sorted(ids)
    by_id = dict(zip(own_ids, db["embeddings"]))
    rows = np.array([by_id[i] for i in ids], dtype=np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    np.testing.assert_allclose(history.vectors, rows, atol=1e-6)
    anchor = history.anchor(config)
    assert anchor is not None and saved_anchor is not None
    np.testing.assert_array_equal(anchor.vector, saved_anchor.vector)
    fresh = HistoryStore().upsert(history.user_id, history.items, rows).anchor(config)
    assert fresh is not None
    np.testing.assert_allclose(anchor.vector, fresh.vector, atol=1e-4)
