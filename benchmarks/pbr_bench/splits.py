"""The tuning split of the hybrid-search and agent-memory benchmarks (``benchmarks/hybrid.py``,
``hybrid_explore.py``, ``agent_memory.py``), fixed before any of their results were read."""

from __future__ import annotations

import hashlib

__all__ = ["is_tuning_question", "is_tuning_user"]


def is_tuning_user(user_id: str) -> bool:
    """Whether a user is in the tuning split: ``int(sha1(user_id), 16) % 3 == 0`` (about a third
    of the users; every other user is test)."""
    return int(hashlib.sha1(user_id.encode()).hexdigest(), 16) % 3 == 0


def is_tuning_question(dataset: str, user_id: str, question_id: str) -> bool:
    """The tuning split of the adaptive-fusion study (``benchmarks/hybrid_adaptive.py``), named
    before its results were read: :func:`is_tuning_user`, except on PersonaBench, whose six users
    all fall in the test split, where it is the questions with ``int(sha1(question_id), 16) %
    3 == 0`` (the same questions at every noise level)."""
    if dataset.startswith("personabench"):
        return int(hashlib.sha1(question_id.encode()).hexdigest(), 16) % 3 == 0
    return is_tuning_user(user_id)
