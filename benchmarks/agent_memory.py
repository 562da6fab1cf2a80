"""Agent memory (issue #23, "Measured"): pbr's memory APIs against the frameworks' own.

What it measures: every LoCoMo conversation (data set ``locomo-turn``; the user is the sample
id, ``conv-26`` ...) is fed turn by turn, in data order, through each memory API's put, then
every scored question of that user is asked through the API's search. The returned items are
mapped back to LoCoMo turn ids (``D1:3`` ...) and scored by R@5 and N@5 (PersonaBench's
best-over-combinations rule, :func:`pbr_bench.metrics.best_over_combinations`),
micro-averaged over questions. Latency is the wall time of each put and search call, measured
in the same run, the stores' calls interleaved (turn by turn and question by question, their
order rotated each time) so that machine noise hits every store alike.

LangGraph (``langgraph.store``), one store each, shared by all users:
    InMemoryStore         ``InMemoryStore(index={"dims": 384, "embed": E, "fields":
                          ["content"]})``: LangGraph's own semantic memory (dense cosine)
    PBRStore hybrid       ``PBRStore(InMemoryStore(), embeddings=E)``: no LLM, so
                          ``PBRConfig(fusion="plain")``, hybrid (dense + BM25) search
    PBRStore dense        ``PBRStore(..., config=PBRConfig(fusion="plain", search="dense"))``:
                          a check, it should rank as InMemoryStore does
Each turn is ``store.put(("memories", user), dia_id, {"content": text})``, each question
``store.search(("memories", user), query=q.text, limit=10)``; the ranking is the returned keys.

LlamaIndex (``llama_index.core.memory``), one block each per user:
    VectorMemoryBlock     ``VectorMemoryBlock(vector_store=ChromaVectorStore(...), embed_model=L)``
                          over an in-process ``chromadb.EphemeralClient`` collection per user
                          (cosine HNSW, ``ef_search`` = ``ef_construction`` = 200)
    PBRMemoryBlock        ``PBRMemoryBlock(user_id=user, embed_model=L)`` (no LLM: hybrid)
both with ``similarity_top_k=5`` and ``retrieval_context_window=1``. (``SimpleVectorStore``, the
in-memory store of ``llama_index.core``, cannot serve: VectorMemoryBlock refuses a store whose
``stores_text`` is False, and SimpleVectorStore's queries return ids without nodes.) Each turn is
one ``block.aput([ChatMessage(role="user", content=text)])`` (directly on the block, not through
``Memory``'s token flushing, so both blocks hold exactly the same items), each question one
``block.aget([ChatMessage(role="user", content=q.text)])``; the returned text is split into its
``<message role='...'>text</message>`` parts, and each part's text mapped back to its turn id
(a text repeated within a conversation, 2 turns in all, takes its ids in data order).

Embeddings: ``E`` (LangChain ``Embeddings``) and ``L`` (LlamaIndex ``BaseEmbedding``) both read
the on-disk all-MiniLM-L6-v2 cache (:class:`pbr_bench.embed.EmbeddingCache`), so every side
ranks with identical vectors and no model runs (all LoCoMo turns and questions are cached; any
text that is not is embedded once and counted). ``VectorMemoryBlock`` embeds a message wrapped as
``<message role='user'>text</message>``; ``L`` maps that envelope to the vector of the text inside
it, so the two LlamaIndex blocks also rank the same vectors (with the real model the envelope
would shift VectorMemoryBlock's vectors slightly). pbr embeds the query stripped of outer
whitespace (one LoCoMo question, conv-30/q22, ends in a space; MiniLM's tokenizer ignores it), the
frameworks embed it as given: that is the one text beyond the turns and questions in the cache.

Split, fixed before any result was read (the rule of ``benchmarks/hybrid.py``): the tuning split
is the users with ``int(hashlib.sha1(user.encode()).hexdigest(), 16) % 3 == 0`` (conv-42, -44,
-47, -48), the test split the rest. Nothing here is tuned, so the test split is the headline only
for consistency with the other benchmarks; all questions are reported too. The paired comparison
(two-sided sign test on per-question R@5) is pbr's hybrid against the framework's store.

Latency: per call, median and p95 in milliseconds, and the ratio pbr / framework of each. A
store's first search of a user is reported apart (pbr builds that user's vectors and indexes
then, from the cache: ``PBRStore`` embeds nothing at put time) and left out of the steady-state
search numbers, for every store alike.

The memory block's query (issue #39 point 7), ``--windows``: which of an agent's latest messages
should make ``PBRMemoryBlock``'s query. ``Memory`` hands a block the whole short-term chat; the
block's ``retrieval_context_window`` N joins the latest N messages' text. The chat an agent holds
when it is asked question i of a user is simulated as that user's earlier questions in data order,
each followed by its reference answer as the assistant's message (as a perfect agent would have
answered; an unanswered question is followed by no answer), then question i: so N = 1 is the
question alone, N = 3 adds the previous question and its answer, N = 5 (``VectorMemoryBlock``'s
default, pbr's before #39) two exchanges. One ``PBRMemoryBlock`` per window (no LLM: hybrid,
``similarity_top_k=5``) over one shared store per user, the turns put once. The choice rule,
fixed before any result was read: on the tuning split, the window with the highest mean R@5
(tie: N@5, then the smaller window); the test split and all questions are reported with
per-question wins / losses and a two-sided sign test (R@5 and N@5) of each window against N = 5.

Run (from the repository root; a few minutes on two cores)::

    python benchmarks/agent_memory.py                 # all 10 conversations, 1536 questions
    python benchmarks/agent_memory.py --users conv-26,conv-30 --no-llamaindex
    python benchmarks/agent_memory.py --windows 1,2,3,5   # the query-window comparison only

Writes ``benchmarks/results/agent_memory/``: ``summary.csv``/``.json`` (R@5, N@5 per part, store
and split; the paired tests and the dense check in the JSON) and ``latency.json``; with
``--windows``, ``window.csv``/``.json`` (R@5, N@5 per window and split, the paired tests, the
choice) instead.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import gc
import json
import platform
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import chromadb
import langgraph.version
import llama_index.core
import numpy as np
from langchain_core.embeddings import Embeddings
from langgraph.store.base import BaseStore
from langgraph.store.memory import InMemoryStore
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.llms import ChatMessage
from llama_index.core.memory import VectorMemoryBlock
from llama_index.vector_stores.chroma import ChromaVectorStore

from langchain_pbr import PBRStore
from llamaindex_pbr import PBRMemoryBlock
from pbr_bench.compare import sign_summary
from pbr_bench.datasets import Dataset, Query, load_named
from pbr_bench.embed import CountingEncoder, EmbeddingCache
from pbr_bench.metrics import best_over_combinations
from pbr_bench.paths import RESULTS_DIR
from pbr_bench.report import bar_png
from pbr_bench.splits import is_tuning_user
from pbr_core import PBRConfig

DATASET = "locomo-turn"
MODEL = "all-MiniLM-L6-v2"
DIMS = 384
K = 10  # LangGraph search limit
CUT = 5  # R@5, N@5 (and the LlamaIndex blocks' similarity_top_k)
SPLITS = ("test", "tune", "all")
#: Chroma's HNSW for VectorMemoryBlock: cosine, search and construction breadth well above the
#: defaults, so that over ~600 items per user it is all but exact.
HNSW: Any = {"space": "cosine", "ef_search": 200, "ef_construction": 200}
OUT = RESULTS_DIR / "agent_memory"

LG_PLAIN, LG_PBR, LG_DENSE = "InMemoryStore", "PBRStore hybrid", "PBRStore dense"
LI_PLAIN, LI_PBR = "VectorMemoryBlock", "PBRMemoryBlock"
#: (part, pbr's store, the framework's store): the latency ratios and paired tests.
PAIRS = [("langgraph", LG_PBR, LG_PLAIN), ("langgraph", LG_DENSE, LG_PLAIN)]
LI_PAIRS = [("llamaindex", LI_PBR, LI_PLAIN)]

_ENVELOPE = re.compile(r"^<message role='[^']*'>(.*)</message>$", re.S)
_PARTS = re.compile(r"<message role='[^']*'>(.*?)</message>", re.S)


class CachedEmbeddings(Embeddings):
    """LangChain ``Embeddings`` reading the cached MiniLM vectors."""

    def __init__(self, cache: EmbeddingCache) -> None:
        self.cache = cache

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.cache.encode(list(texts)).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.cache.encode([text], batch_size=1)[0].tolist()


def unwrap(text: str) -> str:
    """The text inside VectorMemoryBlock's ``<message role='...'>...</message>`` envelope."""
    m = _ENVELOPE.match(text)
    return m.group(1) if m else text


class CachedEmbedding(BaseEmbedding):
    """LlamaIndex ``BaseEmbedding`` reading the cached MiniLM vectors (envelopes unwrapped)."""

    _cache: EmbeddingCache = PrivateAttr()

    def __init__(self, cache: EmbeddingCache) -> None:
        super().__init__(model_name=MODEL)
        self._cache = cache

    def _vectors(self, texts: Sequence[str]) -> list[list[float]]:
        return self._cache.encode([unwrap(t) for t in texts]).tolist()

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._vectors([query])[0]

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._vectors([text])[0]

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return self._get_text_embedding(text)

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._vectors(texts)


@dataclass
class Timings:
    """One store's per-call wall times (seconds)."""

    put: list[float] = field(default_factory=list)
    first_search: list[float] = field(default_factory=list)
    search: list[float] = field(default_factory=list)  # steady state: first per user left out


@dataclass
class Run:
    """One part (langgraph / llamaindex): rankings and timings per store."""

    stores: list[str]
    rankings: dict[str, dict[str, list[str]]]
    timings: dict[str, Timings]
    notes: dict[str, Any] = field(default_factory=dict)


def rotated(names: Sequence[str], i: int) -> list[str]:
    """``names`` starting at element ``i`` (mod len): who goes first changes every call."""
    j = i % len(names)
    return [*names[j:], *names[:j]]


async def atimed(coro: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = await coro
    return out, time.perf_counter() - t0


def questions_by_user(ds: Dataset, users: Sequence[str]) -> dict[str, list[Query]]:
    out: dict[str, list[Query]] = {u: [] for u in users}
    for q in ds.scored_queries:
        if q.user_id in out:
            out[q.user_id].append(q)
    return out


# -- LangGraph -----------------------------------------------------------------------------------
def run_langgraph(ds: Dataset, users: Sequence[str], emb: Embeddings) -> Run:
    stores: dict[str, BaseStore] = {
        LG_PLAIN: InMemoryStore(index={"dims": DIMS, "embed": emb, "fields": ["content"]}),
        LG_PBR: PBRStore(InMemoryStore(), embeddings=emb),
        LG_DENSE: PBRStore(
            InMemoryStore(), embeddings=emb, config=PBRConfig(fusion="plain", search="dense")
        ),
    }
    names = list(stores)
    rankings: dict[str, dict[str, list[str]]] = {n: {} for n in names}
    timings = {n: Timings() for n in names}
    by_user = questions_by_user(ds, users)
    calls = 0
    for user in users:
        ns = ("memories", user)
        gc.collect()
        for doc in ds.corpora[user].docs:
            for name in rotated(names, calls):
                t0 = time.perf_counter()
                stores[name].put(ns, doc.id, {"content": doc.text})
                timings[name].put.append(time.perf_counter() - t0)
            calls += 1
        gc.collect()
        for j, q in enumerate(by_user[user]):
            for name in rotated(names, calls):
                t0 = time.perf_counter()
                found = stores[name].search(ns, query=q.text, limit=K)
                dt = time.perf_counter() - t0
                (timings[name].first_search if j == 0 else timings[name].search).append(dt)
                rankings[name][q.id] = [item.key for item in found]
            calls += 1
        print(f"  langgraph {user}: {len(ds.corpora[user].docs)} turns, {j + 1} questions")
    return Run(names, rankings, timings)


# -- LlamaIndex ----------------------------------------------------------------------------------
class TurnIds:
    """A conversation's turn texts back to their ids (a repeated text: its ids in data order)."""

    def __init__(self, docs: Sequence[Any]) -> None:
        self.ids: dict[str, list[str]] = {}
        for d in docs:
            self.ids.setdefault(d.text, []).append(d.id)
        self.unparsed = 0

    def ranking(self, text: str) -> list[str]:
        out: list[str] = []
        for part in _PARTS.findall(text):
            ids = [i for i in self.ids.get(part, []) if i not in out]
            if ids:
                out.append(ids[0])
            else:
                self.unparsed += 1
        return out


async def run_llamaindex(ds: Dataset, users: Sequence[str], emb: BaseEmbedding) -> Run:
    names = [LI_PLAIN, LI_PBR]
    rankings: dict[str, dict[str, list[str]]] = {n: {} for n in names}
    timings = {n: Timings() for n in names}
    by_user = questions_by_user(ds, users)
    calls = unparsed = 0
    client = chromadb.EphemeralClient()
    for user in users:
        collection = client.create_collection(
            user, configuration={"hnsw": HNSW}, embedding_function=None
        )
        blocks = {
            LI_PLAIN: VectorMemoryBlock(
                vector_store=ChromaVectorStore(chroma_collection=collection),
                embed_model=emb,
                similarity_top_k=CUT,
                retrieval_context_window=1,
            ),
            LI_PBR: PBRMemoryBlock(
                user_id=user, embed_model=emb, similarity_top_k=CUT, retrieval_context_window=1
            ),
        }
        docs = ds.corpora[user].docs
        ids = TurnIds(docs)
        gc.collect()
        for doc in docs:
            for name in rotated(names, calls):
                msg = ChatMessage(role="user", content=doc.text)
                _, dt = await atimed(blocks[name].aput([msg]))
                timings[name].put.append(dt)
            calls += 1
        gc.collect()
        for j, q in enumerate(by_user[user]):
            for name in rotated(names, calls):
                msg = ChatMessage(role="user", content=q.text)
                text, dt = await atimed(blocks[name].aget([msg]))
                (timings[name].first_search if j == 0 else timings[name].search).append(dt)
                rankings[name][q.id] = ids.ranking(str(text))
            calls += 1
        unparsed += ids.unparsed
        print(f"  llamaindex {user}: {len(docs)} turns, {j + 1} questions")
    return Run(names, rankings, timings, notes={"unparsed_parts": unparsed})


# -- the memory block's query window ------------------------------------------------------------
#: The window of ``PBRMemoryBlock`` before #39 (``VectorMemoryBlock``'s default): the baseline.
BASELINE_WINDOW = 5


def window_name(n: int) -> str:
    return f"window {n}"


def chat_at(asked: Sequence[Query], i: int, longest: int) -> list[ChatMessage]:
    """The latest ``longest`` messages of the simulated chat when ``asked[i]`` is asked: the
    earlier questions, each followed by its reference answer (if any), then ``asked[i]``."""
    chat: list[ChatMessage] = []
    for q in asked[max(0, i - longest) : i]:
        chat.append(ChatMessage(role="user", content=q.text))
        if q.answer:
            chat.append(ChatMessage(role="assistant", content=q.answer))
    chat.append(ChatMessage(role="user", content=asked[i].text))
    return chat[-longest:]


async def run_windows(
    ds: Dataset, users: Sequence[str], emb: BaseEmbedding, windows: Sequence[int]
) -> Run:
    names = [window_name(n) for n in windows]
    rankings: dict[str, dict[str, list[str]]] = {n: {} for n in names}
    timings = {n: Timings() for n in names}
    by_user = questions_by_user(ds, users)
    unparsed = 0
    for user in users:
        first = PBRMemoryBlock(user_id=user, embed_model=emb, similarity_top_k=CUT)
        docs = ds.corpora[user].docs
        for doc in docs:
            await first.aput([ChatMessage(role="user", content=doc.text)])
        blocks = {
            window_name(n): PBRMemoryBlock(
                user_id=user,
                embed_model=emb,
                similarity_top_k=CUT,
                retrieval_context_window=n,
                store=first.store,
            )
            for n in windows
        }
        ids = TurnIds(docs)
        asked = by_user[user]
        for i, q in enumerate(asked):
            chat = chat_at(asked, i, max(windows))
            for name in names:
                text, dt = await atimed(blocks[name].aget(chat))
                timings[name].search.append(dt)
                rankings[name][q.id] = ids.ranking(str(text))
        unparsed += ids.unparsed
        print(f"  windows {user}: {len(docs)} turns, {len(asked)} questions")
    return Run(names, rankings, timings, notes={"unparsed_parts": unparsed})


def window_paired(run: Run, queries: Sequence[Query]) -> list[dict[str, Any]]:
    """Each window against :data:`BASELINE_WINDOW`, per split, on R@5 and on N@5."""
    base = per_question(queries, run.rankings[window_name(BASELINE_WINDOW)])
    out = []
    for name in run.stores:
        if name == window_name(BASELINE_WINDOW):
            continue
        scores = per_question(queries, run.rankings[name])
        for split in SPLITS:
            qs = [q for q in queries if in_split(q, split)]
            if not qs:
                continue
            for m, metric in enumerate(("R@5", "N@5")):
                deltas = [scores[q.id][m] - base[q.id][m] for q in qs]
                wins, losses, mean_delta, p = sign_summary(deltas)
                out.append(
                    {
                        "window": name,
                        "baseline": window_name(BASELINE_WINDOW),
                        "split": split,
                        "metric": metric,
                        "n": len(qs),
                        "wins": wins,
                        "losses": losses,
                        "ties": len(qs) - wins - losses,
                        "mean_delta": mean_delta,
                        "p_sign": p,
                    }
                )
    return out


def choose_window(rows: Sequence[dict[str, Any]]) -> str | None:
    """The rule named before the results: best tuning-split R@5, then N@5, then smaller N (None:
    no tuning user was run)."""
    tune = [r for r in rows if r["split"] == "tune"]
    if not tune:
        return None
    best = max(tune, key=lambda r: (r["R@5"], r["N@5"], -int(r["store"].split()[-1])))
    return str(best["store"])


def main_windows(args: argparse.Namespace, ds: Dataset, users: list[str]) -> None:
    started = time.perf_counter()
    windows = sorted({int(w) for w in args.windows.split(",")} | {BASELINE_WINDOW})
    queries = [q for q in ds.scored_queries if q.user_id in users]
    counter = CountingEncoder()
    cache = EmbeddingCache(MODEL, counter)
    by_user = questions_by_user(ds, users)
    texts = {  # every window's query (as the block joins and pbr strips it), embedded in one go
        " ".join(str(m.content) for m in chat_at(asked, i, max(windows))[-n:]).strip()
        for asked in by_user.values()
        for i in range(len(asked))
        for n in windows
    }
    for u in users:
        cache.encode(ds.corpora[u].texts)
    cache.encode(sorted(texts))
    run = asyncio.run(run_windows(ds, users, CachedEmbedding(cache), windows))
    rows = score_rows("window", run, queries)
    paired = window_paired(run, queries)
    chosen = choose_window(rows)
    print(f"\n{'window':<10} {'split':<5} {'n':>5} {'R@5':>7} {'N@5':>7}")
    for r in rows:
        print(f"{r['store']:<10} {r['split']:<5} {r['n']:>5} {r['R@5']:>7.4f} {r['N@5']:>7.4f}")
    print(
        f"\n{'vs ' + window_name(BASELINE_WINDOW):<22} {'split':<5} {'metric':<6} {'W':>4} "
        f"{'L':>4} {'T':>5} {'mean d':>8} {'p':>8}"
    )
    for p in paired:
        print(
            f"{p['window']:<22} {p['split']:<5} {p['metric']:<6} {p['wins']:>4} {p['losses']:>4} "
            f"{p['ties']:>5} {p['mean_delta']:>+8.4f} {p['p_sign']:>8.2g}"
        )
    print(f"\nchosen on the tuning split: {chosen}")
    meta = {
        "dataset": DATASET,
        "users": users,
        "questions": len(queries),
        "windows": windows,
        "baseline": window_name(BASELINE_WINDOW),
        "chat": "earlier questions in data order, each followed by its reference answer",
        "split_rule": "tune = int(sha1(user).hexdigest(), 16) % 3 == 0; test = the rest",
        "choice_rule": "tuning split: highest mean R@5, then N@5, then the smaller window",
        "tune_users": [u for u in users if is_tuning_user(u)],
        "embedder": f"{MODEL} (EmbeddingCache; newly embedded: {counter.encoded})",
        "llama_index_core": llama_index.core.__version__,
        "python": platform.python_version(),
        "seconds": round(time.perf_counter() - started, 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "window.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["store", "split", "n", "R@5", "N@5"])
        w.writeheader()
        for r in rows:
            w.writerow(
                {
                    "store": r["store"],
                    "split": r["split"],
                    "n": r["n"],
                    "R@5": f"{r['R@5']:.4f}",
                    "N@5": f"{r['N@5']:.4f}",
                }
            )
    summary = {"meta": meta, "rows": rows, "paired": paired, "chosen": chosen, **run.notes}
    (args.out / "window.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot(summary["rows"], args.out / "summary.png")
    print(f"\nwrote {args.out} in {meta['seconds']} s")


# -- scoring -------------------------------------------------------------------------------------
def per_question(
    queries: Sequence[Query], ranking: dict[str, list[str]]
) -> dict[str, tuple[float, float]]:
    return {q.id: best_over_combinations(ranking[q.id], q.gold, CUT) for q in queries}


def in_split(q: Query, split: str) -> bool:
    return split == "all" or (split == "tune") == is_tuning_user(q.user_id)


def score_rows(part: str, run: Run, queries: Sequence[Query]) -> list[dict[str, Any]]:
    rows = []
    for name in run.stores:
        scores = per_question(queries, run.rankings[name])
        for split in SPLITS:
            qs = [q for q in queries if in_split(q, split)]
            if not qs:
                continue
            rows.append(
                {
                    "part": part,
                    "store": name,
                    "split": split,
                    "n": len(qs),
                    "R@5": float(np.mean([scores[q.id][0] for q in qs])),
                    "N@5": float(np.mean([scores[q.id][1] for q in qs])),
                }
            )
    return rows


def paired_rows(
    pairs: Sequence[tuple[str, str, str]], runs: dict[str, Run], queries: Sequence[Query]
) -> list[dict[str, Any]]:
    out = []
    for part, ours, theirs in pairs:
        a = per_question(queries, runs[part].rankings[ours])
        b = per_question(queries, runs[part].rankings[theirs])
        for split in SPLITS:
            qs = [q for q in queries if in_split(q, split)]
            if not qs:
                continue
            deltas = [a[q.id][0] - b[q.id][0] for q in qs]
            wins, losses, mean_delta, p = sign_summary(deltas)
            out.append(
                {
                    "part": part,
                    "pbr": ours,
                    "framework": theirs,
                    "split": split,
                    "n": len(qs),
                    "wins": wins,
                    "losses": losses,
                    "ties": len(qs) - wins - losses,
                    "mean_delta_R@5": mean_delta,
                    "p_sign": p,
                }
            )
    return out


def agreement(run: Run, a: str, b: str, queries: Sequence[Query]) -> dict[str, Any]:
    """How closely two stores' rankings agree (the dense check)."""
    ra, rb = run.rankings[a], run.rankings[b]
    deep = min(len(r[q.id]) for r in (ra, rb) for q in queries) > CUT  # else top 5 only
    same10 = sum(ra[q.id] == rb[q.id] for q in queries) if deep else None
    same5 = sum(ra[q.id][:CUT] == rb[q.id][:CUT] for q in queries)
    set5 = sum(set(ra[q.id][:CUT]) == set(rb[q.id][:CUT]) for q in queries)
    sa, sb = per_question(queries, ra), per_question(queries, rb)
    diff_r = sum(sa[q.id][0] != sb[q.id][0] for q in queries)
    return {
        "stores": [a, b],
        "n": len(queries),
        "identical_top10": same10,
        "identical_top5_order": same5,
        "identical_top5_set": set5,
        "questions_with_different_R@5": diff_r,
    }


def ms_stats(xs: Sequence[float]) -> dict[str, float]:
    if not xs:
        return {"n": 0}
    a = np.asarray(xs) * 1000.0
    return {
        "n": int(a.size),
        "median_ms": float(np.median(a)),
        "p95_ms": float(np.percentile(a, 95)),
        "mean_ms": float(a.mean()),
        "max_ms": float(a.max()),
    }


def latency(
    runs: dict[str, Run], pairs: Sequence[tuple[str, str, str]]
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for part, run in runs.items():
        out[part] = {
            "stores": {
                n: {
                    "put": ms_stats(t.put),
                    "first_search": ms_stats(t.first_search),
                    "search": ms_stats(t.search),
                }
                for n, t in run.timings.items()
            },
            "ratios": {},
        }
    for part, ours, theirs in pairs:
        if part not in out:
            continue
        s = out[part]["stores"]
        out[part]["ratios"][f"{ours} / {theirs}"] = {
            op: {
                stat: s[ours][op][stat] / s[theirs][op][stat]
                for stat in ("median_ms", "p95_ms")
                if s[theirs][op].get(stat)
            }
            for op in ("put", "first_search", "search")
        }
    return out


# -- output --------------------------------------------------------------------------------------
def print_tables(
    rows: list[dict[str, Any]], paired: list[dict[str, Any]], lat: dict[str, Any]
) -> None:
    print(f"\n{'part':<11} {'store':<18} {'split':<5} {'n':>5} {'R@5':>7} {'N@5':>7}")
    for r in rows:
        print(
            f"{r['part']:<11} {r['store']:<18} {r['split']:<5} {r['n']:>5} "
            f"{r['R@5']:>7.4f} {r['N@5']:>7.4f}"
        )
    print(f"\n{'paired (R@5)':<46} {'split':<5} {'W':>4} {'L':>4} {'T':>5} {'mean d':>8} {'p':>8}")
    for p in paired:
        label = f"{p['pbr']} vs {p['framework']}"
        print(
            f"{label:<46} {p['split']:<5} {p['wins']:>4} {p['losses']:>4} {p['ties']:>5} "
            f"{p['mean_delta_R@5']:>+8.4f} {p['p_sign']:>8.2g}"
        )
    print(f"\n{'latency (ms)':<30} {'op':<13} {'n':>5} {'median':>8} {'p95':>8}")
    for part, block in lat.items():
        for name, ops in block["stores"].items():
            for op, st in ops.items():
                if st.get("n"):
                    print(
                        f"{part + ' ' + name:<30} {op:<13} {st['n']:>5} "
                        f"{st['median_ms']:>8.3f} {st['p95_ms']:>8.3f}"
                    )
        for label, ops in block["ratios"].items():
            for op, r in ops.items():
                if r:
                    print(
                        f"{'ratio ' + label:<50} {op:<13} median x{r['median_ms']:.2f}, "
                        f"p95 x{r['p95_ms']:.2f}"
                    )


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """R@5 on every question, each framework's own memory against pbr's, per part."""
    groups: dict[str, dict[str, float]] = {}
    for r in rows:
        if r["split"] == "all":
            groups.setdefault(str(r["part"]), {})[str(r["store"])] = r["R@5"]
    bar_png(path, groups, title="agent_memory: R@5, every question", ylabel="R@5")


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", help="comma-separated conversation ids (default: all)")
    ap.add_argument("--no-llamaindex", action="store_true", help="skip the LlamaIndex part")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument(
        "--windows",
        help="compare PBRMemoryBlock's query windows instead, e.g. 1,2,3,5 (5 always included)",
    )
    args = ap.parse_args(argv)

    started = time.perf_counter()
    ds = load_named(DATASET)
    users = sorted({q.user_id for q in ds.scored_queries})
    if args.users:
        wanted = args.users.split(",")
        unknown = sorted(set(wanted) - set(users))
        if unknown:
            raise SystemExit(f"unknown users: {unknown}")
        users = [u for u in users if u in wanted]
    if args.windows:
        main_windows(args, ds, users)
        return
    queries = [q for q in ds.scored_queries if q.user_id in users]

    counter = CountingEncoder()
    cache = EmbeddingCache(MODEL, counter)
    for u in users:  # warm the in-memory cache (and embed anything missing) before timing
        cache.encode(ds.corpora[u].texts)
    cache.encode([q.text for q in queries], batch_size=1)
    print(
        f"{DATASET}: {len(users)} users, {sum(len(ds.corpora[u].docs) for u in users)} turns, "
        f"{len(queries)} questions; texts newly embedded: {counter.encoded}"
    )

    runs: dict[str, Run] = {"langgraph": run_langgraph(ds, users, CachedEmbeddings(cache))}
    pairs = list(PAIRS)
    if not args.no_llamaindex:
        runs["llamaindex"] = asyncio.run(run_llamaindex(ds, users, CachedEmbedding(cache)))
        pairs += LI_PAIRS
    encoded_after_warmup = counter.encoded

    rows = [r for part, run in runs.items() for r in score_rows(part, run, queries)]
    paired = paired_rows(pairs, runs, queries)
    lat = latency(runs, pairs)
    dense_check = agreement(runs["langgraph"], LG_DENSE, LG_PLAIN, queries)
    cross: list[dict[str, Any]] = []
    if "llamaindex" in runs:  # same vectors, same core: the top 5 should agree across frameworks
        both = Run(
            [*runs["langgraph"].stores, *runs["llamaindex"].stores],
            {**runs["langgraph"].rankings, **runs["llamaindex"].rankings},
            {},
        )
        cross = [
            agreement(both, LI_PLAIN, LG_PLAIN, queries),
            agreement(both, LI_PBR, LG_PBR, queries),
        ]
    print_tables(rows, paired, lat)
    print(f"\ndense check ({LG_DENSE} vs {LG_PLAIN}): {dense_check}")
    for c in cross:
        print(f"cross-framework check (top 5 only): {c}")
    if "llamaindex" in runs:
        print(f"llamaindex returned parts not mapped to a turn: {runs['llamaindex'].notes}")

    meta = {
        "dataset": DATASET,
        "users": users,
        "subset": bool(args.users),
        "questions": len(queries),
        "split_rule": "tune = int(sha1(user).hexdigest(), 16) % 3 == 0; test = the rest",
        "tune_users": [u for u in users if is_tuning_user(u)],
        "embedder": f"{MODEL} (EmbeddingCache; newly embedded: {encoded_after_warmup})",
        "langgraph": langgraph.version.__version__,
        "llama_index_core": llama_index.core.__version__,
        "python": platform.python_version(),
        "seconds": round(time.perf_counter() - started, 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "summary.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["part", "store", "split", "n", "R@5", "N@5"])
        w.writeheader()
        for r in rows:
            w.writerow({**r, "R@5": f"{r['R@5']:.4f}", "N@5": f"{r['N@5']:.4f}"})
    summary = {
        "meta": meta,
        "rows": rows,
        "paired": paired,
        "dense_check": dense_check,
        "cross_framework_check": cross,
        "llamaindex_notes": runs["llamaindex"].notes if "llamaindex" in runs else None,
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (args.out / "latency.json").write_text(json.dumps({"meta": meta, **lat}, indent=2) + "\n")
    print(f"\nwrote {args.out} in {meta['seconds']} s")


if __name__ == "__main__":
    main()
