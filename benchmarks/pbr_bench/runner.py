"""Run retrieval methods over a benchmark data set through the same core and the same caches.

Every method produces, per scored question, a ranked list of the asking user's documents; the
rankings are scored with :mod:`pbr_bench.metrics` and kept per question (for paired
comparisons). The PBR methods go through :class:`pbr_core.Personalizer` exactly as an app would;
the LLM comes from the authors' cached gpt-4o-mini generations (PersonaBench only), the embedded
Gemma 3 270M, or any :class:`~pbr_core.protocols.TextGenerator` passed in code (wrap a LangChain
chat model or a LlamaIndex LLM with :func:`generator_from_framework`). Generations are cached on
disk keyed by (model id, prompt), embeddings by (model, text).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from pbr_core.cache import GenerationCache
from pbr_core.config import PBRConfig, SearchMode
from pbr_core.items import HistoryItem
from pbr_core.pipeline import Personalizer, PseudoFeedback
from pbr_core.protocols import TextGenerator, model_id_of

from .bm25 import BM25Index
from .datasets import Dataset, Query, load_pbr_generations
from .embed import EmbeddingCache, minilm_encoder
from .metrics import evaluate
from .paths import GENERATION_CACHE_DIR

#: PBR and its ablations (spec §2.5), by the fusion mode they use.
PBR_METHODS: dict[str, str] = {
    "pbr": "full",
    "pbr-no-anchor": "no_anchor",
    "pbr-no-prf": "no_prf",
    "pbr-no-utterances": "no_utterances",
    "pbr-no-reasoning": "no_reasoning",
    "pbr-safe": "safe",
}
LLM_BASELINES = ("hyde", "query2term", "cot", "thinkqe")
ALL_METHODS = ("plain", "bm25", *PBR_METHODS, *LLM_BASELINES)

# Baseline prompts (spec §4.4), per prompt style: instruction-following vs base completion.
BASELINE_PROMPTS: dict[str, dict[str, str]] = {
    "chat": {
        "hyde": "Write a short passage that answers the question.\nQuestion: {query}\nPassage:",
        "query2term": "Write a list of keywords for the given query.\nQuery: {query}\nKeywords:",
        "cot": "Answer the following query. Give the rationale before answering.\n"
        "Query: {query}\nRationale and answer:",
        "thinkqe": "Think about what the query is really asking, then write a short expansion "
        "of it with the terms a relevant document would contain.\n{feedback}Query: {query}\n"
        "Expansion:",
    },
    "completion": {
        "hyde": "Question: {query}\nA short passage that answers the question:\n",
        "query2term": "Query: {query}\nKeywords for this query:",
        "cot": "Query: {query}\nLet's think step by step, then answer.\n1.",
        "thinkqe": "{feedback}Query: {query}\nWhat the query is asking about, and the words a "
        "relevant document would contain:\n",
    },
}


class CachedEmbedder:
    """The :class:`~pbr_core.protocols.Embedder` protocol over an :class:`EmbeddingCache`."""

    def __init__(self, cache: EmbeddingCache) -> None:
        self.cache = cache
        self.model_id = cache.model_id

    def embed_query(self, text: str) -> list[float]:
        return self.cache.encode([text], batch_size=1)[0].tolist()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.cache.encode(texts).tolist()


@dataclass
class MethodRun:
    """One method on one data set: per-question rankings, metrics and timings."""

    method: str
    llm: str
    rankings: dict[str, list[str]]
    metrics: dict[str, dict[str, float]]
    seconds: float
    stage_ms: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def generator_from_framework(model: Any) -> TextGenerator:
    """Wrap a LangChain chat model / LLM or a LlamaIndex LLM as a pbr_core generator."""

    class _Wrapped:
        model_id = model_id_of(model)

        def generate(self, prompt: str) -> str:
            if hasattr(model, "complete"):  # LlamaIndex LLM
                return str(model.complete(prompt).text)
            out = model.invoke(prompt)  # LangChain
            return out if isinstance(out, str) else str(out.text)

    return _Wrapped()


def _scored(ds: Dataset, limit: int | None, seed: int) -> list[Query]:
    queries = ds.scored_queries
    if limit is not None and limit < len(queries):
        rng = random.Random(seed)
        keep = set(rng.sample(range(len(queries)), limit))
        queries = [q for i, q in enumerate(queries) if i in keep]
    return queries


def generation_cache_of(model_id: str) -> GenerationCache:
    """The committed generation cache of an LLM: ``benchmarks/cache/<model id, made safe>.jsonl``
    (every bench run of that model reads and appends the same file)."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in model_id)
    GENERATION_CACHE_DIR.mkdir(parents=True, exist_ok=True)
    return GenerationCache(GENERATION_CACHE_DIR / f"{safe[:80]}.jsonl")


def generate_missing(
    prompts: Sequence[str],
    batch: Callable[[list[str]], list[str]],
    model_id: str,
    cache: GenerationCache,
    batch_size: int = 8,
    desc: str = "",
) -> int:
    """Generate the prompts ``cache`` lacks for ``model_id``, ``batch_size`` at a time in the
    given order (a fixed order keeps the batches, hence the seeded texts, reproducible), and store
    every answer as written, parsable or not. Returns how many were generated."""
    todo = [p for p in dict.fromkeys(prompts) if cache.get(model_id, p) is None]
    for start in tqdm(range(0, len(todo), batch_size), desc=f"{desc}: generating", unit="batch"):
        chunk = todo[start : start + batch_size]
        for prompt, text in zip(chunk, batch(chunk), strict=True):
            cache.put(model_id, prompt, text)
    return len(todo)


class Bench:
    """Holds one data set, its embeddings and one personalizer over all its users.

    Args:
        dataset: a loaded :class:`Dataset`.
        config: the PBR parameters (sweeps pass per-run configs to :meth:`run`).
        generator: the LLM for P-PRF and the LLM baselines (``None``: no LLM-based method).
        llm_name: how results name the LLM source (``"authors"``, ``"gemma-270m"``, ...).
        limit / seed: score a seeded random subset of the questions (all when None).
        k: ranking depth kept per question.
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        config: PBRConfig | None = None,
        generator: TextGenerator | None = None,
        llm_name: str = "none",
        limit: int | None = None,
        seed: int = 0,
        k: int = 10,
        embeddings: EmbeddingCache | None = None,
        generation_cache: GenerationCache | None = None,
        search: SearchMode = "dense",
    ) -> None:
        if search not in ("dense", "hybrid"):
            raise ValueError(f"search must be 'dense' or 'hybrid', got {search!r}")
        self.ds = dataset
        self.search = search
        self.config = config or PBRConfig()
        self.generator = generator
        self.llm_name = llm_name
        self.k = k
        self.queries = _scored(dataset, limit, seed)
        cache = embeddings or EmbeddingCache("all-MiniLM-L6-v2", minilm_encoder())
        self.embedder = CachedEmbedder(cache)
        if generation_cache is None and generator is not None:
            generation_cache = generation_cache_of(model_id_of(generator))
        self.generation_cache = generation_cache
        self.personalizer = Personalizer(
            self.embedder, generator, config=self.config, cache=generation_cache
        )
        users = sorted({q.user_id for q in self.queries})
        for user in tqdm(users, desc=f"{dataset.name}: embedding corpora", unit="user"):
            corpus = dataset.corpora[user]
            vecs = cache.encode(corpus.texts)
            items = [
                HistoryItem(id=d.id, text=d.text, metadata={}, timestamp=None) for d in corpus.docs
            ]
            self.personalizer.add_items(user, items, vectors=vecs)
        self.authors: dict[str, tuple[list[str], str]] | None = None

    # -- rankings ------------------------------------------------------------------------------
    def _search(self, user: str, vector: np.ndarray) -> list[str]:
        history = self.personalizer.store.get(user)
        return [history.items[i].id for i, _ in history.search(vector, self.k)]

    def _feedback(self, q: Query) -> PseudoFeedback | None:
        if self.llm_name != "authors":
            return None
        if self.authors is None:
            self.authors = load_pbr_generations()
        fake, reason = self.authors[q.id]
        return PseudoFeedback(list(fake), reason)

    def prefill(
        self, methods: Sequence[str], config: PBRConfig | None = None, batch_size: int = 8
    ) -> int:
        """Generate every uncached P-PRF / baseline prompt of ``methods`` in batches.

        Why: a local model on CPU is memory-bound, so one batched ``generate`` of 8 prompts costs
        little more than one of 2; the runs that follow read the generation cache. ThinkQE's
        second prompts hold what its first answers retrieved, so they are built and batched in a
        second round. Generators without ``generate_batch`` are left to :meth:`run`. Returns how
        many prompts it generated.
        """
        gen = self.generator
        batch = getattr(gen, "generate_batch", None)
        if (
            gen is None
            or batch is None
            or self.generation_cache is None
            or self.llm_name == "authors"
        ):
            return 0
        cfg = config or self.config
        model_id, cache = model_id_of(gen), self.generation_cache
        wanted: dict[str, None] = {}  # ordered set: a fixed order keeps batches reproducible
        style = getattr(gen, "prompt_style", "chat")
        baseline = BASELINE_PROMPTS["completion" if style == "completion" else "chat"]
        for q in self.queries:
            for method in methods:
                if method in PBR_METHODS:
                    pair = self.personalizer.feedback_prompts(
                        q.user_id, q.text, config=cfg.with_(fusion=PBR_METHODS[method])
                    )
                    wanted.update(dict.fromkeys(pair or ()))
                elif method in LLM_BASELINES:  # thinkqe: its first, feedback-free call
                    wanted[_fill(baseline[method], q.text, "")] = None
        done = self._generate_missing(list(wanted), batch, model_id, cache, batch_size)
        if "thinkqe" in methods:  # its second call needs the first's answer: a second round
            template = baseline["thinkqe"]
            second = {
                self._thinkqe_second_prompt(q, first, template): None
                for q in self.queries
                if (first := cache.get(model_id, _fill(template, q.text, ""))) is not None
            }
            done += self._generate_missing(list(second), batch, model_id, cache, batch_size)
        return done

    def _generate_missing(
        self,
        prompts: list[str],
        batch: Callable[[list[str]], list[str]],
        model_id: str,
        cache: GenerationCache,
        batch_size: int,
    ) -> int:
        return generate_missing(prompts, batch, model_id, cache, batch_size, desc=self.ds.name)

    def run(self, method: str, config: PBRConfig | None = None, progress: bool = True) -> MethodRun:
        """Rank every selected question with ``method`` and score the rankings."""
        cfg = config or self.config
        start = time.perf_counter()
        rankings: dict[str, list[str]] = {}
        stage: dict[str, list[float]] = {}
        weights: dict[str, dict[str, Any]] = {}
        rank_fn = self._ranker(method, cfg, stage, weights)
        bar = tqdm(
            self.queries,
            desc=f"{self.ds.name} {method} ({self.llm_name})",
            unit="q",
            disable=not progress,
            leave=False,
        )
        for q in bar:
            rankings[q.id] = rank_fn(q)
        gold = {q.id: q.gold for q in self.queries}
        cats = {q.id: q.category for q in self.queries}
        ks = sorted({1, 5, self.k})
        metrics = evaluate(rankings, gold, ks=ks, categories=cats)
        return MethodRun(
            method=f"{method}+hybrid" if self._ranks_hybrid(method) else method,
            llm=self.llm_name if method not in ("plain", "bm25", "pbr-no-prf") else "none",
            rankings=rankings,
            metrics=metrics,
            seconds=time.perf_counter() - start,
            stage_ms={k: float(np.median(v)) for k, v in stage.items()},
            extra={"per_question": weights} if weights else {},
        )

    def _ranks_hybrid(self, method: str) -> bool:
        """Whether ``method`` ranks through the library's hybrid search: the plain query and the
        PBR modes with ``search="hybrid"``; BM25 and the LLM baselines rank as they always do."""
        return self.search == "hybrid" and (method == "plain" or method in PBR_METHODS)

    def _ranker(
        self,
        method: str,
        cfg: PBRConfig,
        stage: dict[str, list[float]],
        weights: dict[str, dict[str, Any]],
    ) -> Callable[[Query], list[str]]:
        if method == "bm25":
            indexes: dict[str, BM25Index] = {}

            def bm25(q: Query) -> list[str]:
                if q.user_id not in indexes:
                    c = self.ds.corpora[q.user_id]
                    indexes[q.user_id] = BM25Index(c.ids, c.texts)
                return indexes[q.user_id].search([q.text], self.k)[0]

            return bm25
        if method == "plain" or method in PBR_METHODS:
            mode = "plain" if method == "plain" else PBR_METHODS[method]
            run_cfg = cfg.with_(fusion=mode)
            hybrid_cfg = run_cfg.with_(search="hybrid")

            def pbr(q: Query) -> list[str]:
                if self._ranks_hybrid(method):  # the library's own search: both legs, fused
                    found = self.personalizer.search(
                        q.user_id, q.text, self.k, config=hybrid_cfg, feedback=self._feedback(q)
                    )
                    pq, ranking = found.personalized, [h.id for h in found.hits]
                else:  # the paper's protocol: q* against the user's vectors
                    pq = self.personalizer.personalize(
                        q.user_id, q.text, config=run_cfg, feedback=self._feedback(q)
                    )
                    ranking = self._search(q.user_id, pq.vector)
                for name, ms in pq.explanation.timings_ms.items():
                    stage.setdefault(name, []).append(ms)
                e = pq.explanation
                weights[q.id] = {"w1": e.w1, "w2": e.w2, "dropped": sorted(e.dropped)}
                return ranking

            return pbr
        if method in LLM_BASELINES:
            return self._baseline(method, stage)
        raise ValueError(f"unknown method {method!r}; choose from {ALL_METHODS}")

    def _generate(self, prompt: str) -> str:
        gen = self.generator
        if gen is None:
            raise ValueError("this method needs an LLM: pass --llm local (or a generator)")
        model_id = model_id_of(gen)
        cache = self.generation_cache
        hit = cache.get(model_id, prompt) if cache is not None else None
        if hit is not None:
            return hit
        out = gen.generate(prompt)
        if cache is not None:
            cache.put(model_id, prompt, out)
        return out

    def _baseline(self, method: str, stage: dict[str, list[float]]) -> Callable[[Query], list[str]]:
        style = getattr(self.generator, "prompt_style", "chat")
        prompts = BASELINE_PROMPTS["completion" if style == "completion" else "chat"]
        emb = self.embedder

        def run(q: Query) -> list[str]:
            t0 = time.perf_counter()
            qv = np.asarray(emb.embed_query(q.text))
            if method == "thinkqe":
                first = self._generate(_fill(prompts["thinkqe"], q.text, ""))
                second = self._generate(self._thinkqe_second_prompt(q, first, prompts["thinkqe"]))
                vec = np.asarray(emb.embed_query(f"{q.text} {first} {second}"))
            else:
                out = self._generate(_fill(prompts[method], q.text, ""))
                if method == "hyde":
                    vec = (qv + np.asarray(emb.embed_documents([out or q.text])[0])) / 2
                else:
                    vec = np.asarray(emb.embed_query(f"{q.text} {out}".strip()))
            stage.setdefault("total", []).append((time.perf_counter() - t0) * 1000)
            return self._search(q.user_id, vec)

        return run

    def _thinkqe_second_prompt(self, q: Query, first: str, template: str) -> str:
        """ThinkQE's second prompt: the query with the top 3 items the first expansion found."""
        v1 = np.asarray(self.embedder.embed_query(f"{q.text} {first}"))
        top = self._search(q.user_id, v1)[:3]
        texts = [self.personalizer.store.get(q.user_id).item(i).text[:300] for i in top]
        return _fill(template, q.text, "".join(f"Document: {t}\n" for t in texts))


def _fill(template: str, query: str, feedback: str) -> str:
    return template.replace("{query}", query).replace("{feedback}", feedback)


def save_run(
    run: MethodRun, dataset: str, out_dir: Path, settings: Mapping[str, Any] | None = None
) -> None:
    """Write a method's metrics (JSON, with the run's ``settings``: what its numbers depend on
    beyond the data set's name) and per-question rankings (JSONL)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{dataset}__{run.method}__{run.llm}"
    (out_dir / f"{stem}.json").write_text(
        json.dumps(
            {
                "dataset": dataset,
                "method": run.method,
                "llm": run.llm,
                "seconds": round(run.seconds, 3),
                "metrics": run.metrics,
                "stage_ms_median": run.stage_ms,
                **({"settings": dict(settings)} if settings is not None else {}),
            },
            indent=1,
        )
    )
    with (out_dir / f"{stem}.rankings.jsonl").open("w") as fh:
        for qid, ranking in run.rankings.items():
            row = {"q": qid, "top": ranking, **run.extra.get("per_question", {}).get(qid, {})}
            fh.write(json.dumps(row) + "\n")


def metric_table(runs: Sequence[MethodRun], columns: Sequence[str]) -> list[dict[str, Any]]:
    """Rows ``{method, llm, n, <columns of Overall>}`` for printing and CSV."""
    rows = []
    for r in runs:
        overall = r.metrics["Overall"]
        rows.append(
            {
                "method": r.method,
                "llm": r.llm,
                "n": int(overall["n"]),
                **{c: round(overall.get(c, float("nan")), 4) for c in columns},
            }
        )
    return rows
