"""PBR's parameters in one immutable object (spec §2), with the defaults and why."""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, get_args

from .lexical import STEMMERS, StemmerName

FusionMode = Literal[
    "full",  # q + c_anchor + w1·f_avg + w2·r          (spec §2.4, the paper's PBR)
    "paper",  # the same as "full", by the name issue #9 asks for (reproduces the paper)
    "no_anchor",  # q + w1·f_avg + w2·r with mid = q      (ablation "w/o P-Anchor")
    "no_prf",  # q + c_anchor                           (ablation "w/o P-PRF")
    "no_utterances",  # q + c_anchor + w2·r              (ablation: drop the pseudo utterances)
    "no_reasoning",  # q + c_anchor + w1·f_avg           (ablation: drop the pseudo reasoning)
    "plain",  # q                                    (no personalization at all)
    "safe",  # full, each LLM term scaled by its query-time trust (see pbr_core.fusion)
]
#: The fusion modes, in the order above: read from the type, so the two cannot drift apart.
FUSION_MODES: tuple[FusionMode, ...] = get_args(FusionMode)

# How a user's items are ranked for the personalized query (see pbr_core.hybrid).
SearchMode = Literal["hybrid", "dense", "lexical"]
SEARCH_MODES: tuple[SearchMode, ...] = get_args(SearchMode)
ExplainMode = Literal["none", "scores", "first", "all"]
#: The optional stage after ranking: none, or the ranked candidates re-ordered by salience.
RerankMode = Literal["none", "salience"]
RERANK_MODES: tuple[RerankMode, ...] = get_args(RerankMode)
EXPLAIN_MODES: tuple[ExplainMode, ...] = get_args(ExplainMode)


@dataclass(frozen=True)
class PBRConfig:
    """All knobs of the method. Frozen: a config is part of every cache key.

    Attributes:
        k1: related history items shown to the LLM (spec §2.1; the authors used 10 on long
            histories, 5 is the spec's default).
        num_utterances: pseudo utterances asked for (``m``, spec §2.2).
        max_item_chars: each related item is cut to this many characters in prompts, so a prompt
            stays bounded whatever the history holds.
        theta: similarity threshold of the anchor's kNN graph (spec §2.3).
        k2: neighbours per node, the node itself included.
        alpha: PageRank damping. ``1.0`` is pure power iteration, as in the authors' code.
        pagerank_tol: stop when the L2 change of the PageRank vector falls below this.
        pagerank_max_iter: step cap of the power iteration.
        exact_knn_max_items: up to this many history items the kNN graph is exact (faiss flat
            inner product); above it an IVF index approximates it (docs/performance.md,
            "Anchor build").
        fusion: which terms enter the personalized query (spec §2.4, §2.5).
        top_anchor_items: how many highest-PageRank items the explanation lists.
        trust_low: ``"safe"`` fusion: a pseudo-feedback term whose cosine with the query is at or
            below this has trust 0.
        trust_high: ``"safe"`` fusion: at or above this cosine a term has trust 1; in between, a
            linear ramp.
        safe_min_shift: ``"safe"`` fusion: the share of the paper's shift applied at trust 0
            (``q* = q + λ·(q*_paper − q)``, ``λ`` = this + (1 − this)·mean trust).
        safe_history_gate: ``"safe"`` fusion: keep the plain query when the user's closest
            history item is closer to the query than every pseudo-feedback term (the query is
            already clear for this user; see :mod:`pbr_core.fusion`).
        pre_gate: ``"safe"`` fusion: the *pre-generation gate*. When the query's cosine with the
            user's closest history item is at or above this, the two P-PRF LLM calls are not
            made and ``q*`` is the plain query, with the reason in ``explanation.skipped``: what
            the history gate would most likely have kept after paying for the calls (it keeps
            the plain query whenever that item is closer to the query than all the feedback).
            ``None`` disables it; so does ``safe_history_gate=False`` (the gate predicts that
            gate); ignored by the other fusion modes, whose ``q*`` without feedback is not
            theirs. The default 0.52 (``benchmarks/pre_gate.py``, ``docs/configuration.md``): the
            middle of the band where every measured cell keeps R@5 / N@5 within .005 of
            always-call with <= 0.5 LLM calls per LoCoMo question and >= 1.8 on PersonaBench;
            confirmed on 200 held-out LoCoMo questions (0.19 calls per question, R@5 -.0005).
        max_query_chars: the query is cut to this many characters in the two prompts (like a
            history item, to ``max_item_chars``), so a huge query cannot make huge prompts. Only
            the prompts: the query's embedding ``q`` is made from the whole query.
        llm_timeout_s: each P-PRF LLM call (the wait for a free call slot included) is given up
            after this many seconds: the term is dropped with the reason ("the LLM call timed out
            after 30 s"), or strict mode raises :class:`~pbr_core.errors.LLMTimeoutError`.
            ``None`` waits forever (not recommended for a server). A sync call that is given up
            cannot be killed: it finishes in the background (see :mod:`pbr_core.executor`).
            A generator that computes in this process (``in_process = True``: the embedded
            Gemma and its LangChain / LlamaIndex wrappers; the benchmark harness's SmolLM2) is
            not timed: it cannot hang on a network, and its first call loads the model.
        max_concurrent_llm_calls: the size of the :class:`~pbr_core.executor.LLMExecutor` a
            personalizer creates when none is given: at most this many LLM calls in flight at once
            for the personalizers that share it (those over one history store), e.g. what a
            rate-limited API allows. A per-call config does not resize an existing executor.
        max_answer_chars: an LLM answer is cut to this many characters before it is parsed
            (10 utterances of ~40 words need ~3,000), so a runaway answer costs bounded time.
        search: how the user's items are ranked for ``q*`` (:mod:`pbr_core.hybrid`):
            ``"hybrid"`` (dense and BM25, each scaled to [0, 1] per query, BM25 weighted by
            how much of the question its best match covers; each result returns its
            relevance, comparable across queries: :func:`pbr_core.hybrid.relevance`),
            ``"dense"`` (cosine only, the paper's setting) or ``"lexical"`` (BM25 only).
        lexical_context: in hybrid mode, how much of its two neighbours' BM25 (the items added
            just before and after it) an item takes into the fused rule
            (:func:`pbr_core.hybrid.with_context`); 0 (default): none. For histories added in
            the order they happened (a conversation's turns), where an answer rarely repeats
            its question's words: :data:`pbr_core.hybrid.LEXICAL_CONTEXT` (0.5) raised LoCoMo
            turn-level R@5 from .5497 to .5681, all questions (docs/hybrid.md). Off by default
            because it reads the order of the user's items, which only the process that added
            them knows: a worker that reads a host store cold gets the rows in the store's
            order (PostgreSQL: key order), and would rank otherwise.
        lexical_stemmer: the lexical leg's analyzer: ``None`` (default), the words as they are;
            ``"english"``, each word reduced to its English Snowball stem (PyStemmer: "visited",
            "visits" -> "visit"), items, the user's words and the LLM's feedback alike. Opt-in:
            on LoCoMo (chat turns and sessions) it raised recall significantly, on PrefEval
            (a preference buried in filler chat) it lowered N@5 significantly, because the
            fillers match the question more often too (docs/hybrid.md, "Stemming"). Each
            analyzer is its own index per user, built on first use and kept with the user's
            history (and its shared state).
        lexical_feedback_weight: in the lexical leg, the weight of each P-PRF text that entered
            ``q*`` (pseudo utterances, reasoning) next to the user's own words (weight 1): PBR's
            feedback expands the BM25 query too, not only the vector. 0 searches with the user's
            words alone. The default 0.25: on PersonaBench 0.0 with the authors' gpt-4o-mini
            feedback, hybrid + PBR R@5 .3966 at 0, .5007 at 0.25, .5045 at 0.5 (dense + PBR:
            .4569); measured there only (``docs/hybrid.md``).
        explain: what of the request the adapters' results carry in their metadata. The
            default ``"none"``: nothing that depends on the query, the items as stored (one
            item is the same document whatever query found it, so LangChain's
            ``MultiQueryRetriever`` / ``EnsembleRetriever`` merge it, and a trace holds one
            explanation, not ``k``); the explanation and each result's scores reach the
            framework's events and callbacks (``pbr.anchor`` ... ``pbr.fusion``,
            ``pbr.results``). ``"scores"``: every result its scores (``score``,
            ``store_score``, ``pbr_search``); ``"first"``: those, and the top result the
            explanation (``metadata["pbr"]``); ``"all"``: every result both. A LlamaIndex
            ``NodeWithScore`` keeps its ``score`` in every mode.
        rerank: an opt-in stage after ranking. ``"none"`` (default); ``"salience"``: the
            ``rerank_candidates`` best results are re-ordered by their Bayes-factor salience for
            the query (``log p(q | item) − log p(q)`` under a small LM, :mod:`pbr_core.salience`;
            the embedded Gemma 3 270M unless the request names a scorer) and the ``k`` first
            returned. Costs ``rerank_candidates + 1`` LM sequences per query (seconds on CPU;
            measured in ``docs/hybrid.md``, "Re-ranking").
        rerank_candidates: how many of the best ranked results the re-rank stage re-orders,
            whatever ``k``: a request for more gets the rest in the ranking's order after
            them, so the first results are the same for every ``k`` (pages never skip or
            repeat an item).
    """

    k1: int = 5
    num_utterances: int = 10
    max_item_chars: int = 800
    theta: float = 0.65
    k2: int = 5
    alpha: float = 0.85
    pagerank_tol: float = 1e-6
    pagerank_max_iter: int = 50
    exact_knn_max_items: int = 10_000
    fusion: FusionMode = "safe"
    top_anchor_items: int = 3
    trust_low: float = 0.5
    trust_high: float = 0.7
    safe_min_shift: float = 0.2
    safe_history_gate: bool = True
    pre_gate: float | None = 0.52
    max_query_chars: int = 800
    llm_timeout_s: float | None = 30.0
    max_concurrent_llm_calls: int = 16
    max_answer_chars: int = 20_000
    search: SearchMode = "hybrid"
    lexical_feedback_weight: float = 0.25
    lexical_context: float = 0.0
    lexical_stemmer: StemmerName | None = None
    explain: ExplainMode = "none"
    rerank: RerankMode = "none"
    rerank_candidates: int = 10

    def __post_init__(self) -> None:
        # Types first (an int, not a bool; a finite real number), so that a wrong type is
        # named here instead of failing at the first query (2.5 as a slice bound, NaN as k).
        problems = [
            f"{name} must be an integer >= {least}, got {getattr(self, name)!r}"
            for name, least in _INTEGERS
            if not _integer_at_least(getattr(self, name), least)
        ]
        problems += [
            f"{name} must be a finite number, got {getattr(self, name)!r}"
            for name in _REALS
            if not _finite(getattr(self, name))
        ]
        if not isinstance(self.safe_history_gate, bool):
            problems.append(
                f"safe_history_gate must be True or False, got {self.safe_history_gate!r}"
            )
        if problems:  # the range checks below assume the types
            raise ValueError("invalid PBRConfig: " + "; ".join(problems))
        if not -1.0 <= self.theta <= 1.0:
            problems.append(f"theta is a cosine threshold in [-1, 1], got {self.theta}")
        if not 0.0 < self.alpha <= 1.0:
            problems.append(f"alpha must lie in (0, 1], got {self.alpha}")
        if self.pagerank_tol <= 0:
            problems.append(f"pagerank_tol must be > 0, got {self.pagerank_tol}")
        if self.fusion not in FUSION_MODES:
            problems.append(f"fusion must be one of {FUSION_MODES}, got {self.fusion!r}")
        if not -1.0 <= self.trust_low < self.trust_high <= 1.0:
            problems.append(
                f"need -1 <= trust_low < trust_high <= 1, got {self.trust_low}, {self.trust_high}"
            )
        if not 0.0 <= self.safe_min_shift <= 1.0:
            problems.append(f"safe_min_shift must lie in [0, 1], got {self.safe_min_shift}")
        gate = self.pre_gate
        if gate is not None and (
            isinstance(gate, bool) or not isinstance(gate, int | float) or not -1.0 <= gate <= 1.0
        ):
            problems.append(f"pre_gate is a cosine threshold in [-1, 1] (or None), got {gate!r}")
        timeout = self.llm_timeout_s
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 0 < timeout <= threading.TIMEOUT_MAX  # a thread's wait takes no more
        ):
            problems.append(
                f"llm_timeout_s must be a number of seconds > 0 and at most "
                f"{threading.TIMEOUT_MAX:.3g} (or None: no timeout), got {timeout!r}"
            )
        if self.search not in SEARCH_MODES:
            problems.append(f"search must be one of {SEARCH_MODES}, got {self.search!r}")
        if self.explain not in EXPLAIN_MODES:
            problems.append(f"explain must be one of {EXPLAIN_MODES}, got {self.explain!r}")
        if self.rerank not in RERANK_MODES:
            problems.append(f"rerank must be one of {RERANK_MODES}, got {self.rerank!r}")
        if self.lexical_stemmer is not None and self.lexical_stemmer not in STEMMERS:
            problems.append(
                f"lexical_stemmer must be one of {STEMMERS} or None, got {self.lexical_stemmer!r}"
            )
        for name in ("lexical_feedback_weight", "lexical_context"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not 0 <= value < math.inf  # inf: inf * 0 = NaN, the lexical leg drops out
            ):
                problems.append(f"{name} must be a finite number >= 0, got {value!r}")
        if problems:
            raise ValueError("invalid PBRConfig: " + "; ".join(problems))

    def with_(self, **changes: Any) -> PBRConfig:
        """A copy with some fields changed (validated like the original)."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def anchor_key(self) -> tuple[float, int, float, float, int, int]:
        """The fields the anchor depends on (its cache key, with the history version)."""
        return (
            self.theta,
            self.k2,
            self.alpha,
            self.pagerank_tol,
            self.pagerank_max_iter,
            self.exact_knn_max_items,
        )


def as_config(value: object) -> PBRConfig:
    """The :class:`PBRConfig` an entry point was given: one as it is, a mapping of its fields
    (checked as :class:`PBRConfig` checks them, nothing coerced: ``{"k1": "10"}`` is refused),
    or None for the defaults.

    Raises:
        TypeError: anything else; ValueError: a field :class:`PBRConfig` does not have or
            refuses.
    """
    if value is None:
        return PBRConfig()
    if isinstance(value, PBRConfig):
        return value
    if isinstance(value, Mapping):
        unknown = sorted(set(map(str, value)) - set(PBRConfig.__dataclass_fields__))
        if unknown:  # a typo ("fuson") is a ValueError like any other bad field
            raise ValueError(f"invalid PBRConfig: no field(s) {unknown}; see PBRConfig's fields")
        return PBRConfig(**value)
    raise TypeError(
        f"config must be a PBRConfig or a dict of its fields, got {type(value).__name__}"
    )


#: The integer fields and their least value.
_INTEGERS = (
    ("k1", 1),
    ("num_utterances", 1),
    ("max_item_chars", 1),
    ("k2", 1),
    ("pagerank_max_iter", 1),
    ("exact_knn_max_items", 0),
    ("top_anchor_items", 0),
    ("max_query_chars", 1),
    ("max_concurrent_llm_calls", 1),
    ("max_answer_chars", 1),
    ("rerank_candidates", 1),
)
#: The real-number fields (their ranges are checked after the types).
_REALS = ("theta", "alpha", "pagerank_tol", "trust_low", "trust_high", "safe_min_shift")


def _integer_at_least(value: object, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _finite(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and value == value
        and abs(value) != float("inf")
    )
