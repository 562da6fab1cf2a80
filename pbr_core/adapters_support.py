"""What every framework adapter reports about a request, defined once.

The LangChain and LlamaIndex retrievers translate types and wire callbacks; what they *say* about
a request (which progress events, what goes into a result's metadata, when a request counts as
degraded, what a user without history gets) is decided here, so both adapters say the same thing.
Framework-free, like the rest of pbr_core.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from .config import ExplainMode, PBRConfig
from .corpus import RAW_SCORE_KEY, ScoredRecord, check_user_id
from .errors import VectorStoreUnavailableError
from .fusion import MODE_TERMS, TERMS
from .protocols import declared_model_id, model_id_of
from .results import Explanation, explanation_payload, missing_terms

__all__ = [
    "EXPLANATION_KEY",
    "SCORE_KEY",
    "SEARCH_KEY",
    "TERMS",
    "annotated",
    "check_positive_int",
    "check_user_id",
    "declared_model_id",
    "explanation_events",
    "explanation_payload",
    "host_store_errors",
    "memory_config",
    "missing_terms",
    "model_id",
    "owner_of",
    "result_metadata",
    "results_event",
]

#: Metadata key of a result's score (hybrid: its relevance in [0, 1],
#: :func:`pbr_core.hybrid.relevance`; dense: the cosine with ``q*``; lexical: BM25),
#: non-increasing down the results.
SCORE_KEY = "score"
#: Metadata key of the request's explanation (:func:`explanation_payload`).
EXPLANATION_KEY = "pbr"
#: Metadata key of how pbr ranked a result: ``{"mode", "dense", "dense_rank", "lexical",
#: "lexical_rank"}`` (see :mod:`pbr_core.hybrid`), plus ``"salience"`` and
#: ``"rank_before_rerank"`` after the re-rank stage (:mod:`pbr_core.rerank`).
SEARCH_KEY = "pbr_search"


def owner_of(
    metadata: Mapping[str, Any], default: str | None, user_key: str, what: str, fix: str
) -> str:
    """The user an item of a multi-user batch is for: its ``metadata[user_key]``, else
    ``default`` (the user the call names). One rule for LangChain's ``from_documents`` and
    LlamaIndex's ``from_defaults``; a per-user add names its user and the corpus refuses an item
    whose metadata names another. ``what`` names the item and ``fix`` says, in the framework's
    terms, how to give its user. A ``None`` under ``user_key`` names no user, as a missing key."""
    user = metadata.get(user_key)
    if user is None:
        user = default
    if user is None:
        raise ValueError(f"{what} has no {user_key!r} metadata and no user was given; {fix}")
    return check_user_id(user)


def model_id(model: object) -> str:
    """A model's identity, as pbr_core keys caches and records stores with it.

    Its ``model_id``, ``model_name`` or ``model`` string attribute, else its class name.
    """
    return model_id_of(model)


def check_positive_int(value: object, name: str) -> int:
    """``value`` if it is an integer >= 1 (not a bool): ``k``, ``similarity_top_k``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def memory_config(config: PBRConfig | None, has_llm: bool, owner: str) -> PBRConfig:
    """The config of an agent-memory adapter (``owner`` names it in the error): without an LLM
    ``fusion="plain"`` (a pure hybrid search), with one ``"safe"``; a given config whose fusion
    calls an LLM that was not given is refused rather than silently degraded."""
    cfg = config if config is not None else PBRConfig(fusion="safe" if has_llm else "plain")
    if not has_llm and (MODE_TERMS[cfg.fusion][1] or MODE_TERMS[cfg.fusion][2]):
        raise ValueError(
            f"fusion {cfg.fusion!r} calls an LLM, but {owner} got no llm: pass llm=..., or use "
            "fusion='plain' (pure hybrid search) or 'no_prf' (history anchor only)"
        )
    return cfg


def annotated(position: int, explain: ExplainMode) -> tuple[bool, bool]:
    """``(scores, explanation)``: whether the result at ``position`` (0 = the top) carries
    pbr's scores and the request's explanation, by :attr:`PBRConfig.explain`.

    The default, ``"none"``, puts nothing that depends on the query into a result: one item is
    the same object whatever query found it (what LangChain's ``MultiQueryRetriever`` merges by)
    and a trace holds one copy of the explanation, in the request's events
    (:func:`explanation_events`, :func:`results_event`), not ``k``."""
    if explain == "none":
        return False, False
    if explain == "scores":
        return True, False
    return True, explain == "all" or position == 0


def result_scores(record: ScoredRecord, mode: str) -> dict[str, Any]:
    """One result's query-specific scores under their metadata keys: ``score`` (what ``mode``
    ranks by), ``store_score`` (the host's own, None when pbr ranked without a host search) and
    ``pbr_search`` (both legs' scores and ranks)."""
    return {
        SCORE_KEY: record.hit.score,
        RAW_SCORE_KEY: record.raw_score,
        SEARCH_KEY: {"mode": mode, **(record.hit.legs or {})},
    }


def result_metadata(
    position: int,
    record: ScoredRecord,
    mode: str,
    explain: ExplainMode,
    payload: Mapping[str, Any],
) -> dict[str, Any]:
    """What pbr adds to the stored metadata of the result at ``position``, by
    :attr:`PBRConfig.explain` (:func:`annotated`): its scores (:func:`result_scores`) and the
    request's explanation ``payload`` under ``pbr``; nothing by default. The one rule for
    every adapter; the explanation's query is cut (:meth:`Explanation.shown_query`), so a huge
    query is never copied whole into a result."""
    scores, explained = annotated(position, explain)
    extra: dict[str, Any] = result_scores(record, mode) if scores else {}
    if explained:
        extra[EXPLANATION_KEY] = payload
    return extra


def explanation_events(explanation: Explanation) -> list[tuple[str, dict[str, Any]]]:
    """The progress events of one request, as ``(name, data)`` pairs in pipeline order.

    ``pbr.anchor`` (related and most central history items), ``pbr.pseudo_utterances``,
    ``pbr.reasoning``, ``pbr.fusion`` (terms used, weights ``w1``/``w2``, dropped terms, timings
    in ms, ``skipped``: the terms ``"safe"`` fusion chose to leave out, ``trust``, the LLM calls
    made and answered from the cache, ``degraded``) and, only when a wanted term is missing
    because something failed, ``pbr.degraded``. Together they hold the whole explanation
    (:func:`explanation_payload`); after the ranking, :func:`results_event` adds each result's
    scores. Every payload carries ``user_id`` and ``query`` (cut like the explanation's) and is
    JSON-ready.
    """
    full = explanation.to_dict()
    base = {"user_id": explanation.user_id, "query": explanation.shown_query()}
    events: list[tuple[str, dict[str, Any]]] = [
        ("pbr.anchor", {**base, "anchor_items": full["anchor_items"], "related": full["related"]}),
        ("pbr.pseudo_utterances", {**base, "pseudo_utterances": full["pseudo_utterances"]}),
        ("pbr.reasoning", {**base, "reasoning": full["reasoning"]}),
        (
            "pbr.fusion",
            {
                **base,
                **{
                    key: full[key]
                    for key in (
                        "fusion",
                        "used",
                        "w1",
                        "w2",
                        "dropped",
                        "skipped",
                        "trust",
                        "timings_ms",
                        "llm_calls",
                        "llm_cached",
                    )
                },
                "degraded": bool(missing_terms(explanation)),
            },
        ),
    ]
    missing = missing_terms(explanation)
    if missing:
        events.append(("pbr.degraded", {**base, "missing": missing}))
    return events


def results_event(
    explanation: Explanation, results: Sequence[ScoredRecord], mode: str
) -> tuple[str, dict[str, Any]]:
    """``pbr.results``: the request's results in rank order, each its user's ``id`` and its
    scores (:func:`result_scores`): the query-specific part of every result, reported once per
    request however :attr:`PBRConfig.explain` annotates the results themselves. The stage times
    include the search's (``timings_ms``)."""
    base = {"user_id": explanation.user_id, "query": explanation.shown_query()}
    rows = [{"id": r.hit.id, **result_scores(r, mode)} for r in results]
    timings = {k: round(v, 3) for k, v in explanation.timings_ms.items()}
    return "pbr.results", {**base, "mode": mode, "results": rows, "timings_ms": timings}


# Transport failures of the HTTP clients vector-store SDKs use, recognised by class name so that
# pbr_core imports none of them: httpx's ``TransportError`` family (connection refused, reset,
# timeout, server gone mid-request) and requests' ``ConnectionError``; builtin ``ConnectionError``
# (``OSError`` subclasses such as ``ConnectionRefusedError``) by type. A SQLAlchemy error whose
# ``connection_invalidated`` is True is a lost database connection (the server stopped or
# crashed mid-statement; SQLAlchemy has dropped the pool's connections and reconnects on the next
# call): PGVector and PGVectorStore raise it as ``sqlalchemy.exc.OperationalError``.
_TRANSPORT_ERRORS = frozenset({"TransportError", "ConnectionError"})


def _transport_error(exc: BaseException) -> BaseException | None:
    """The connection failure in ``exc``'s chain (itself, its cause or context), if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if (
            isinstance(current, ConnectionError)
            or getattr(current, "connection_invalidated", False) is True
            or any(cls.__name__ in _TRANSPORT_ERRORS for cls in type(current).__mro__)
        ):
            return current
        current = current.__cause__ or current.__context__
    return None


def _server_url(exc: BaseException) -> str | None:
    """``scheme://host:port`` of the request that failed, read from an httpx-style error."""
    try:
        request = getattr(exc, "request", None)  # httpx raises RuntimeError when unset
    except RuntimeError:
        return None
    url = getattr(request, "url", None)
    if url is None:
        return None
    parts = urlsplit(str(url))
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else None


@contextlib.contextmanager
def host_store_errors(store: object, action: str, *, new_ids: int = 0) -> Iterator[None]:
    """Turn "cannot connect to the vector store" into :class:`VectorStoreUnavailableError`.

    The message names the server's URL (the store's own client error often does not) and says
    what was and was not done; any other error passes through unchanged.

    Args:
        store: the host vector store (its class name goes into the message).
        action: what was being done, e.g. ``"search"``; with ``"add"`` / ``"delete"`` the message
            says that PBR's history was left as it was (the adapters write the host store first).
        new_ids: how many items of an add were given no id and got a new one: a retry would
            give them other new ids, so it would add them again, and the message says so.
    """
    try:
        yield
    except Exception as exc:
        cause = _transport_error(exc)
        if cause is None:
            raise
        url = _server_url(cause)
        where = f" at {url}" if url else "" if store is None else f" ({type(store).__name__})"
        unchanged = ""
        if action == "delete":
            unchanged = (
                "; PBR's history is unchanged and retrying the same call is safe (where the "
                "delete landed before the reply was lost, the retry's KeyError names the ids "
                "already gone)"
            )
        elif action == "add" and not new_ids:
            unchanged = "; PBR's history is unchanged and retrying the same call is safe"
        elif action == "add":
            unchanged = (
                f"; PBR's history is unchanged, but {new_ids} of the items had no id and were "
                "given new ones, so retrying the same call would add those again where the "
                "first try landed: give every item an id (e.g. Document.id) to make a retry exact"
            )
        raise VectorStoreUnavailableError(
            f"{action} failed: the vector store{where} is not reachable "
            f"({type(cause).__name__}: {cause}){unchanged}. Check that the server is running "
            "and that the client's host and port point to it, then retry",
            url=url,
        ) from exc
