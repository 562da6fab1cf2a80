"""The Personalizer end to end with fakes that isolate it from real models."""

from __future__ import annotations

import asyncio
import threading
from typing import ClassVar

import numpy as np
import pytest
from conftest import HashEmbedder, ScriptedGenerator, TableEmbedder

from pbr_core import (
    EmbeddingError,
    GenerationCache,
    GenerationError,
    PBRConfig,
    PersistenceError,
    Personalizer,
    PseudoFeedback,
    SearchHit,
    UnknownUserError,
    compute_anchor,
    fuse,
)

UTTER = '{"candidates": ["I could roast some beets tonight", "maybe kale chips again"]}'
REASON = "Step 1: the user cooks vegetables. Step 2: they want a dinner idea."


def unit(v) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v)


#: Hand-chosen 3-d vectors: three history items, a query, two utterances and a reasoning.
TABLE = {
    "h1": [1, 0, 0],
    "h2": [0.9, 0.1, 0],
    "h3": [0, 1, 0],
    "q": [0.5, 0.5, 0.1],
    "u1": [1, 1, 0],
    "u2": [0, 1, 1],
    "reason": [0, 0, 1],
}


def make(generator=None, **kwargs) -> Personalizer:
    """Two users over hash vectors, with the paper's fusion: hash vectors are nearly orthogonal to
    the query, so the default "safe" fusion would (rightly) drop every term these tests follow."""
    kwargs.setdefault("config", PBRConfig(fusion="paper"))
    p = Personalizer(HashEmbedder(), generator or ScriptedGenerator(UTTER, REASON), **kwargs)
    p.add_texts(
        "alice",
        ["kale salad", "roasted beets", "morning run", "oat porridge"],
        ids=["a1", "a2", "a3", "a4"],
    )
    p.add_texts(
        "bob", ["sushi omakase", "ghost pepper sauce", "street tacos"], ids=["b1", "b2", "b3"]
    )
    return p


def test_the_personalized_vector_is_the_spec_fusion_of_real_terms() -> None:
    table = TABLE
    cfg = PBRConfig(theta=0.0, k2=2, alpha=0.85, fusion="paper")
    p = Personalizer(TableEmbedder(table), config=cfg)
    p.add_texts("u", ["h1", "h2", "h3"])
    got = p.personalize("u", "q", feedback=PseudoFeedback(["u1", "u2"], "reason"))

    vecs = np.array([unit(table[h]) for h in ("h1", "h2", "h3")], dtype=np.float32)
    anchor = compute_anchor(vecs, cfg).vector
    f_avg = (unit(table["u1"]) + unit(table["u2"])) / 2
    want = fuse(unit(table["q"]), anchor=anchor, f_avg=f_avg, r=unit(table["reason"])).vector
    np.testing.assert_allclose(got.vector, unit(want), atol=1e-6)
    expl = got.explanation
    assert expl.used == ("query", "anchor", "utterances", "reasoning")
    assert expl.pseudo_utterances == ["u1", "u2"] and expl.reasoning == "reason"
    assert expl.w1 is not None and 0 <= expl.w1 <= 2


def test_results_stay_within_the_users_corpus() -> None:
    p = make()
    for user, prefix in (("alice", "a"), ("bob", "b"), ("alice", "a")):
        hits = p.search(user, "what should I eat?", k=10).hits
        assert hits and all(h.id.startswith(prefix) for h in hits)


def test_explanation_lists_history_anchor_weights_and_timings() -> None:
    expl = make().personalize("alice", "what should I eat?").explanation
    assert len(expl.related) == 4 and {h.id for h in expl.related} <= {"a1", "a2", "a3", "a4"}
    assert expl.pseudo_utterances == ["I could roast some beets tonight", "maybe kale chips again"]
    assert expl.reasoning == REASON
    assert len(expl.anchor_items) == 3
    assert sum(h.score for h in expl.anchor_items) <= 1.0
    assert {"embed_query", "related_history", "anchor", "llm", "fusion", "total"} <= set(
        expl.timings_ms
    )
    assert expl.to_dict()["dropped"] == {}


def test_both_llm_calls_run_concurrently_in_the_sync_api() -> None:
    barrier = threading.Barrier(2, timeout=5)

    class Rendezvous(ScriptedGenerator):
        def generate(self, prompt: str) -> str:
            barrier.wait()  # raises BrokenBarrierError if the other call is not in flight
            return super().generate(prompt)

    expl = make(Rendezvous(UTTER, REASON)).personalize("alice", "dinner?").explanation
    assert expl.dropped == {}


def test_a_batching_generator_gets_both_prompts_in_one_call() -> None:
    class Batching(ScriptedGenerator):
        batches: ClassVar[list[int]] = []

        def generate_batch(self, prompts: list[str]) -> list[str]:
            self.batches.append(len(prompts))
            return [self.generate(p) for p in prompts]

    gen = Batching(UTTER, REASON)
    make(gen).personalize("alice", "dinner?")
    assert gen.batches == [2]


async def test_both_llm_calls_run_concurrently_in_the_async_api() -> None:
    started: list[str] = []
    both = asyncio.Event()

    class AsyncGen(ScriptedGenerator):
        async def agenerate(self, prompt: str) -> str:
            started.append(prompt)
            if len(started) == 2:
                both.set()
            await asyncio.wait_for(both.wait(), timeout=5)
            return self.generate(prompt)

    pq = await make(AsyncGen(UTTER, REASON)).apersonalize("alice", "dinner?")
    assert pq.explanation.dropped == {}


async def test_sync_and_async_give_the_same_vector() -> None:
    p = make()
    sync = p.personalize("alice", "dinner?").vector
    np.testing.assert_allclose((await p.apersonalize("alice", "dinner?")).vector, sync, atol=1e-7)


class _HalfBroken(ScriptedGenerator):
    def generate(self, prompt: str) -> str:
        if "candidates" in prompt:
            raise TimeoutError("LLM timed out")
        return super().generate(prompt)


@pytest.mark.parametrize(
    ("generator", "user", "kwargs"),
    [
        (None, "alice", {}),
        (_HalfBroken(UTTER, REASON), "alice", {}),  # one term degraded
        (None, "nobody", {"unknown_user": "plain"}),
        (None, "alice", {"feedback": PseudoFeedback(["beets again"], "they cook")}),
        (None, "alice", {"config": PBRConfig(pre_gate=0.0)}),  # pre-gated: no LLM call
    ],
    ids=["ok", "degraded", "unknown-user", "given-feedback", "pre-gated"],
)
async def test_sync_and_async_run_the_same_steps(generator, user: str, kwargs) -> None:
    p = make(generator)
    sync = p.personalize(user, "dinner?", **kwargs)
    asyn = await p.apersonalize(user, "dinner?", **kwargs)
    np.testing.assert_allclose(asyn.vector, sync.vector, atol=1e-7)
    a, b = sync.explanation.to_dict(), asyn.explanation.to_dict()
    a.pop("timings_ms"), b.pop("timings_ms")
    assert a == b
    assert sync.explanation.timings_ms.keys() == asyn.explanation.timings_ms.keys()


def test_generations_are_cached_on_disk_by_model_and_prompt(tmp_path) -> None:
    path = tmp_path / "gen.jsonl"
    gen = ScriptedGenerator(UTTER, REASON)
    first = make(gen, cache=GenerationCache(path)).personalize("alice", "dinner?")
    assert len(gen.prompts) == 2
    again = make(gen, cache=GenerationCache(path)).personalize("alice", "dinner?")
    assert len(gen.prompts) == 2  # no new LLM call, from a fresh process's point of view
    np.testing.assert_allclose(again.vector, first.vector)
    other_model = ScriptedGenerator(UTTER, REASON)
    other_model.model_id = "test/another"
    make(other_model, cache=GenerationCache(path)).personalize("alice", "dinner?")
    assert len(other_model.prompts) == 2


def test_a_generation_cache_given_a_folder_says_to_name_a_file(tmp_path) -> None:
    with pytest.raises(ValueError, match="is a folder; give a file in it"):
        GenerationCache(tmp_path)


async def test_an_async_request_writes_the_generation_cache_off_the_event_loop(tmp_path) -> None:
    """The cache's file append is I/O: an async request does it in a worker thread, never on
    the event loop (before, on it). What it writes is what a sync request writes."""

    class Watched(GenerationCache):
        on_loop: ClassVar[list[bool]] = []

        def put(self, model_id: str, prompt: str, text: str) -> None:
            try:
                asyncio.get_running_loop()
                self.on_loop.append(True)
            except RuntimeError:
                self.on_loop.append(False)
            super().put(model_id, prompt, text)

    await make(cache=Watched(tmp_path / "a.jsonl")).apersonalize("alice", "dinner?")
    assert Watched.on_loop == [False, False]
    make(cache=GenerationCache(tmp_path / "s.jsonl")).personalize("alice", "dinner?")
    assert (tmp_path / "a.jsonl").read_text() == (tmp_path / "s.jsonl").read_text()


def test_a_generator_that_declares_no_model_id_is_not_cached(tmp_path) -> None:
    """Its class name is all pbr would key its answers by, and two different models share it:
    the second one's answers would be the first one's (before, they were)."""

    class Anonymous:
        def __init__(self, utter: str) -> None:
            self.scripted = ScriptedGenerator(utter, REASON)

        def generate(self, prompt: str) -> str:
            return self.scripted.generate(prompt)

    path = tmp_path / "gen.jsonl"
    first, second = Anonymous(UTTER), Anonymous(UTTER.replace("beets", "leeks"))
    a = make(first, cache=GenerationCache(path)).personalize("alice", "dinner?")  # type: ignore[arg-type]
    b = make(second, cache=GenerationCache(path)).personalize("alice", "dinner?")  # type: ignore[arg-type]
    assert len(second.scripted.prompts) == 2 and len(GenerationCache(path)) == 0
    assert a.explanation.pseudo_utterances != b.explanation.pseudo_utterances


def test_a_failing_llm_drops_its_term_and_says_why() -> None:
    class Broken(ScriptedGenerator):
        def generate(self, prompt: str) -> str:
            if "candidates" in prompt:
                raise TimeoutError("LLM timed out")
            return super().generate(prompt)

    expl = make(Broken(UTTER, REASON)).personalize("alice", "dinner?").explanation
    assert expl.used == ("query", "anchor", "reasoning")
    assert "TimeoutError: LLM timed out" in expl.dropped["utterances"]
    with pytest.raises(GenerationError, match="timed out"):
        make(Broken(UTTER, REASON)).personalize("alice", "dinner?", strict=True)


def test_an_unparseable_answer_drops_its_term() -> None:
    p = make(ScriptedGenerator("Sorry, I cannot do that.", "   "))
    expl = p.personalize("alice", "dinner?").explanation
    assert expl.used == ("query", "anchor")
    assert set(expl.dropped) == {"utterances", "reasoning"}
    with pytest.raises(GenerationError):
        p.personalize("alice", "dinner?", strict=True)


def test_fusion_modes_switch_terms_off_without_calling_the_llm() -> None:
    gen = ScriptedGenerator(UTTER, REASON)
    p = make(gen)
    plain = p.personalize("alice", "dinner?", config=PBRConfig(fusion="plain"))
    np.testing.assert_allclose(plain.vector, plain.query_vector, atol=1e-7)
    no_prf = p.personalize("alice", "dinner?", config=PBRConfig(fusion="no_prf"))
    assert gen.prompts == []
    assert no_prf.explanation.used == ("query", "anchor")
    assert "switched off" in no_prf.explanation.dropped["utterances"]


def test_a_one_item_history_has_no_anchor_and_an_emptied_one_falls_back_to_plain() -> None:
    p = Personalizer(HashEmbedder(), ScriptedGenerator(UTTER, REASON))
    p.add_texts("solo", ["only item"], ids=["s1"])
    expl = p.personalize("solo", "q?").explanation
    assert "anchor" not in expl.used and "needs 2" in expl.dropped["anchor"]
    p.delete("solo", ["s1"])
    pq = p.personalize("solo", "q?")
    np.testing.assert_allclose(pq.vector, pq.query_vector, atol=1e-7)
    assert p.search("solo", "q?", k=3).hits == []


def test_bad_requests_fail_clearly() -> None:
    p = make()
    with pytest.raises(ValueError, match="non-empty"):
        p.personalize("alice", "   ")
    with pytest.raises(UnknownUserError, match="carol"):
        p.personalize("carol", "dinner?")
    with pytest.raises(ValueError, match="k must be"):
        p.search("alice", "dinner?", k=0)
    # search reads the user's corpus itself (it raised a TypeError naming an internal class)
    with pytest.raises(TypeError, match="search\\(\\) takes no history="):
        p.search("alice", "dinner?", history=p.store.get("alice"))


def test_given_feedback_is_a_list_of_strings_not_a_string_read_letter_by_letter() -> None:
    """``PseudoFeedback(utterances="I would cook")`` became one utterance per character, each
    embedded and fused into q* (from a review); a reasoning of another type failed later."""
    with pytest.raises(TypeError, match="single string"):
        PseudoFeedback(utterances="I would cook")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="reasoning must be a string"):
        PseudoFeedback(utterances=["x"], reasoning=["a list"])  # type: ignore[arg-type]
    given = PseudoFeedback(utterances=(u for u in ["roast beets", "kale chips"]))  # type: ignore[arg-type]
    assert given.utterances == ("roast beets", "kale chips")
    pq = make().personalize("alice", "dinner?", feedback=given)
    assert pq.explanation.pseudo_utterances == ["roast beets", "kale chips"]


def test_an_embedder_that_changes_dimension_or_returns_nan_corrupts_nothing() -> None:
    p = make()
    before = p.store.get("alice")
    p.corpus.embedder = HashEmbedder(dim=8)
    with pytest.raises(EmbeddingError, match="dimension 8"):
        p.personalize("alice", "dinner?")
    with pytest.raises(EmbeddingError, match="dimension 8"):
        p.add_texts("alice", ["new item"])

    class NaNEmbedder(HashEmbedder):
        def embed_documents(self, texts):
            return [[float("nan")] * 16 for _ in texts]

    p.corpus.embedder = NaNEmbedder()
    with pytest.raises(EmbeddingError, match="NaN"):
        p.add_texts("alice", ["new item"])
    assert p.store.get("alice") is before


def test_history_items_are_embedded_once() -> None:
    emb = HashEmbedder()
    p = Personalizer(emb, ScriptedGenerator(UTTER, REASON))
    p.add_texts("u", ["a", "b"], ids=["1", "2"])
    p.add_texts("u", ["a", "b changed", "c"], ids=["1", "2", "3"])
    assert emb.calls == [2, 2]  # "a" was not embedded again


def test_a_saved_personalizer_refuses_another_embedding_model(tmp_path) -> None:
    p = make()
    p.save(str(tmp_path / "s"))
    loaded = Personalizer.load(
        str(tmp_path / "s"), HashEmbedder(), generator=p.generator, config=p.config
    )
    np.testing.assert_allclose(
        loaded.personalize("bob", "hot?").vector, p.personalize("bob", "hot?").vector, atol=1e-7
    )
    other = HashEmbedder()
    other.model_id = "test/other-model"
    with pytest.raises(PersistenceError, match="other-model"):
        Personalizer.load(str(tmp_path / "s"), other)


def test_safe_fusion_reports_its_trust_and_shift_and_never_uses_the_anchor_alone() -> None:
    table = TABLE
    cfg = PBRConfig(
        theta=0.0, k2=2, fusion="safe", trust_low=0.5, trust_high=0.9, safe_min_shift=0.25,
        pre_gate=None,  # cos(q, h1) = 0.69: the pre-generation gate would skip the feedback
    )  # fmt: skip
    p = Personalizer(TableEmbedder(table), config=cfg)
    p.add_texts("u", ["h1", "h2", "h3"])
    got = p.personalize("u", "q", feedback=PseudoFeedback(["u1", "u2"], "reason"))

    vecs = np.array([unit(table[h]) for h in ("h1", "h2", "h3")], dtype=np.float32)
    anchor = compute_anchor(vecs, cfg).vector
    f_avg = (unit(table["u1"]) + unit(table["u2"])) / 2
    want = fuse(
        unit(table["q"]),
        anchor=anchor,
        f_avg=f_avg,
        r=unit(table["reason"]),
        mode="safe",
        trust_low=0.5,
        trust_high=0.9,
        safe_min_shift=0.25,
        best_history_cos=float(np.max(vecs @ unit(table["q"]))),
    )
    np.testing.assert_allclose(got.vector, unit(want.vector), atol=1e-6)
    expl = got.explanation
    assert expl.trust == pytest.approx(want.trust)
    assert 0.25 < expl.trust["shift"] < 1.0  # cos(q, f) = 0.86 is trusted, cos(q, r) = 0.14 not
    assert expl.to_dict()["trust"] == {k: round(v, 4) for k, v in expl.trust.items()}

    # no usable pseudo feedback: the plain query, with the reason, not q + anchor
    bare = Personalizer(TableEmbedder(table), ScriptedGenerator("no list", ""), config=cfg)
    bare.add_texts("u", ["h1", "h2", "h3"])
    plain = bare.personalize("u", "q")
    np.testing.assert_allclose(plain.vector, plain.query_vector, atol=1e-7)
    assert "anchor is never used alone" in plain.explanation.dropped["anchor"]


def test_safe_fusion_keeps_the_plain_query_when_the_history_already_matches_it() -> None:
    # "h1" points exactly where the query does (cosine 1), closer than any pseudo feedback.
    table = {**TABLE, "h1": TABLE["q"]}
    p = Personalizer(TableEmbedder(table), config=PBRConfig(theta=0.0, k2=2))
    p.add_texts("u", ["h1", "h2", "h3"])
    got = p.personalize("u", "q", feedback=PseudoFeedback(["u1", "u2"], "reason"))
    np.testing.assert_allclose(got.vector, got.query_vector, atol=1e-7)
    assert got.explanation.used == ("query",)
    assert got.explanation.trust["closest_history"] == pytest.approx(1.0)
    assert "closest history item (cosine 1.00)" in got.explanation.dropped["utterances"]
    # switched off, the same request moves the query
    off = p.personalize(
        "u", "q", config=p.config.with_(safe_history_gate=False),
        feedback=PseudoFeedback(["u1", "u2"], "reason"),
    )  # fmt: skip
    assert off.explanation.used == ("query", "anchor", "utterances", "reasoning")
    assert float(off.vector @ got.vector) < 0.999


def test_an_unknown_user_can_get_the_plain_query_with_the_reason() -> None:
    p = make()
    pq = p.personalize("carol", "dinner?", unknown_user="plain")
    np.testing.assert_allclose(pq.vector, unit(HashEmbedder().embed_query("dinner?")), atol=1e-6)
    assert pq.explanation.used == ("query",)
    assert set(pq.explanation.dropped) == {"anchor", "utterances", "reasoning"}
    assert "has no history" in pq.explanation.dropped["anchor"]
    assert "carol" not in p.store  # asking never creates a user
    apq = asyncio.run(p.apersonalize("carol", "dinner?", unknown_user="plain"))
    np.testing.assert_allclose(apq.vector, pq.vector, atol=1e-7)
    with pytest.raises(UnknownUserError, match="carol"):
        asyncio.run(p.apersonalize("carol", "dinner?"))


def test_feedback_prompts_are_exactly_what_personalize_sends() -> None:
    gen = ScriptedGenerator(UTTER, REASON)
    p = make(gen)
    prompts = p.feedback_prompts("alice", "what should I cook?")
    assert prompts is not None and not gen.prompts  # building prompts calls no LLM
    p.personalize("alice", "what should I cook?")
    assert sorted(gen.prompts) == sorted(prompts)
    assert p.feedback_prompts("alice", "dinner?", config=PBRConfig(fusion="no_prf")) is None


def test_paper_mode_is_the_papers_fusion() -> None:
    p = make()
    full = p.personalize("alice", "dinner?", config=PBRConfig(fusion="full"))
    paper = p.personalize("alice", "dinner?", config=PBRConfig(fusion="paper"))
    np.testing.assert_allclose(paper.vector, full.vector, atol=1e-7)
    assert paper.explanation.w1 == full.explanation.w1
    assert paper.explanation.w2 == full.explanation.w2


def test_a_lazily_loaded_personalizer_answers_like_the_saved_one(tmp_path) -> None:
    p = make()
    p.save(str(tmp_path / "s"))
    lazy = Personalizer.load(
        str(tmp_path / "s"), HashEmbedder(), lazy=True, generator=p.generator, config=p.config
    )
    np.testing.assert_allclose(
        lazy.personalize("alice", "dinner?").vector,
        p.personalize("alice", "dinner?").vector,
        atol=1e-7,
    )


def test_a_fusion_rule_plugs_in_and_sees_the_requests_terms() -> None:
    """``Personalizer(fusion_rule=...)``: the pipeline hands the rule every term and the related
    history, normalises what it returns and explains it; the default rule is the spec's."""
    from pbr_core.fusion import FusionInputs, FusionResult, default_rule

    seen: list[FusionInputs] = []

    def only_reasoning(inputs: FusionInputs) -> FusionResult:
        seen.append(inputs)
        assert inputs.r is not None
        return FusionResult(vector=2.0 * inputs.r, w1=None, w2=1.0, used=("query", "reasoning"))

    cfg = PBRConfig(theta=0.0, k2=2, alpha=0.85, fusion="paper")
    feedback = PseudoFeedback(["u1", "u2"], "reason")
    custom = Personalizer(TableEmbedder(TABLE), config=cfg, fusion_rule=only_reasoning)
    custom.add_texts("u", ["h1", "h2", "h3"])
    got = custom.personalize("u", "q", feedback=feedback)
    np.testing.assert_allclose(got.vector, unit(TABLE["reason"]), atol=1e-6)
    assert got.explanation.used == ("query", "reasoning") and got.explanation.w2 == 1.0
    (inputs,) = seen
    assert inputs.config.fusion == "paper" and inputs.anchor is not None
    assert [inputs.history.items[i].id for i in inputs.related] == [
        h.id for h in got.explanation.related
    ]
    assert inputs.best_history_cos == pytest.approx(got.explanation.related[0].score)

    spec = Personalizer(TableEmbedder(TABLE), config=cfg, store=custom.store)
    assert spec.fusion_rule is default_rule
    want = spec.personalize("u", "q", feedback=feedback)
    np.testing.assert_allclose(
        want.vector, unit(default_rule(inputs).vector).astype(np.float32), atol=1e-6
    )


def test_a_huge_query_is_shown_cut_in_the_explanation_not_copied_whole() -> None:
    import json

    from pbr_core.adapters_support import explanation_events, explanation_payload
    from pbr_core.results import SHOWN_QUERY_CHARS

    query = "beets " * 200_000  # 1.2 MB
    result = make().search("alice", query, k=4)
    expl = result.personalized.explanation
    assert expl.query == query.strip()  # the request itself keeps it whole (the lexical leg)
    shown = explanation_payload(expl)["query"]
    assert len(shown) == SHOWN_QUERY_CHARS and shown.endswith("…")
    assert len(json.dumps(explanation_payload(expl))) < 20_000
    assert all(len(data["query"]) == SHOWN_QUERY_CHARS for _, data in explanation_events(expl))
    assert {h.id for h in result.hits} == {"a1", "a2", "a3", "a4"}


async def test_an_async_search_builds_a_cold_users_anchor_and_bm25_index_off_the_event_loop(
    monkeypatch,
) -> None:
    """The anchor (kNN graph, PageRank) and the BM25 index of a user no request read before
    are CPU work, 1.5 s at 10k items: built in a worker thread, never on the event loop
    (before, both ran on it)."""
    import pbr_core.snapshot as snapshot

    loop_thread = threading.current_thread()
    on_loop: dict[str, bool] = {}
    real_anchor, real_build = snapshot.compute_anchor, snapshot.LexicalIndex.build

    def anchor(*args, **kwargs):
        on_loop["anchor"] = threading.current_thread() is loop_thread
        return real_anchor(*args, **kwargs)

    def build(*args, **kwargs):
        on_loop["lexical"] = threading.current_thread() is loop_thread
        return real_build(*args, **kwargs)

    monkeypatch.setattr(snapshot, "compute_anchor", anchor)
    monkeypatch.setattr(snapshot.LexicalIndex, "build", staticmethod(build))
    p = make(config=PBRConfig(fusion="no_prf"))
    found = await p.asearch("alice", "dinner?", k=2)
    assert on_loop == {"anchor": False, "lexical": False} and len(found.hits) == 2


async def test_an_async_search_a_callers_own_search_ranks_builds_no_bm25_index(monkeypatch) -> None:
    """``Personalizer(vector_search=...)`` ranks with the caller's search: pbr's BM25 index
    would be memory and CPU spent for nothing (an async request built it)."""
    import pbr_core.snapshot as snapshot

    built: list[bool] = []
    real_build = snapshot.LexicalIndex.build
    monkeypatch.setattr(
        snapshot.LexicalIndex,
        "build",
        staticmethod(lambda *a, **k: built.append(True) or real_build(*a, **k)),
    )

    class Theirs:
        def search(self, user_id, vector, k):
            return [SearchHit(id="a1", score=1.0)]

    p = make(config=PBRConfig(fusion="no_prf"), vector_search=Theirs())
    found = await p.asearch("alice", "dinner?", k=1)
    assert [h.id for h in found.hits] == ["a1"] and built == []
