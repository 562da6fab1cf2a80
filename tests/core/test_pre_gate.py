"""The pre-generation gate (PBRConfig.pre_gate): no LLM call when the history already matches."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from conftest import ScriptedGenerator, TableEmbedder

from pbr_core import PBRConfig, Personalizer, PseudoFeedback

U1, U2 = "I could roast some beets tonight", "maybe kale chips again"
UTTER = f'{{"candidates": ["{U1}", "{U2}"]}}'
REASON = "Step 1: the user cooks vegetables. Step 2: they want a dinner idea."

#: 3-d vectors: cos(q, h1) = 0.80, cos(q, h2) ≈ 0.74, cos(q, h3) ≈ 0.70 (h3 and the feedback
#: terms are chosen so that without the gates the query moves).
TABLE = {
    "h1": [0.8, 0.6, 0.0],
    "h2": [0.6, 0.6, 0.53],
    "h3": [0.7, 0.0, 0.714],
    "q": [1.0, 0.0, 0.0],
    U1: [0.95, 0.3, 0.0],
    U2: [0.95, 0.0, 0.3],
    REASON: [0.9, 0.3, 0.3],
}


def make(pre_gate: float | None, **changes) -> tuple[Personalizer, ScriptedGenerator]:
    gen = ScriptedGenerator(UTTER, REASON)
    cfg = PBRConfig(theta=0.0, k2=2, pre_gate=pre_gate, **changes)
    p = Personalizer(TableEmbedder(TABLE), gen, config=cfg)
    p.add_texts("u", ["h1", "h2", "h3"])
    return p, gen


def cos(a, b) -> float:
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_the_gate_fires_without_calling_the_llm() -> None:
    assert cos(TABLE["q"], TABLE["h1"]) == pytest.approx(0.8)
    p, gen = make(pre_gate=0.75)
    pq = p.personalize("u", "q")
    assert gen.prompts == []  # no LLM call
    np.testing.assert_allclose(pq.vector, pq.query_vector, atol=1e-7)  # safe fusion: q* = q
    e = pq.explanation
    assert e.used == ("query",)
    assert e.llm_calls == 0 and e.llm_cached == 0
    for term in ("anchor", "utterances", "reasoning"):
        assert e.skipped[term].startswith("pre-generation gate:")
        assert "cosine 0.80" in e.skipped[term] and e.dropped[term] == e.skipped[term]
    degraded = set(e.dropped) - set(e.skipped)
    assert not degraded  # a deliberate choice, not a failure
    assert "llm" not in e.timings_ms and "fusion" in e.timings_ms
    assert e.trust["closest_history"] == pytest.approx(0.8) and e.trust["shift"] == 0.0
    assert e.to_dict()["llm_calls"] == 0
    assert p.feedback_prompts("u", "q") is None  # batch prefill skips it too
    # the async path alike
    apq = asyncio.run(p.apersonalize("u", "q"))
    assert gen.prompts == [] and apq.explanation.skipped == e.skipped
    np.testing.assert_allclose(apq.vector, pq.vector, atol=1e-7)


def test_given_feedback_is_gated_alike() -> None:
    p, _ = make(pre_gate=0.75)
    pq = p.personalize("u", "q", feedback=PseudoFeedback([U1, U2], REASON))
    np.testing.assert_allclose(pq.vector, pq.query_vector, atol=1e-7)
    assert pq.explanation.skipped["utterances"].startswith("pre-generation gate:")


def test_a_disabled_gate_calls_the_llm() -> None:
    p, gen = make(pre_gate=None)
    e = p.personalize("u", "q").explanation
    assert len(gen.prompts) == 2 and e.llm_calls == 2
    assert not any(v.startswith("pre-generation") for v in e.skipped.values())


# 0.85: above cos(q, h1); 0.75: would fire, but the history gate it predicts is off.
@pytest.mark.parametrize("pre_gate", [None, 0.85, 0.75])
def test_an_unmet_or_switched_off_gate_calls_the_llm(pre_gate: float | None) -> None:
    # history gate off, so that the LLM's terms visibly enter q*
    p, gen = make(pre_gate=pre_gate, safe_history_gate=False)
    pq = p.personalize("u", "q")
    assert len(gen.prompts) == 2
    e = pq.explanation
    assert e.llm_calls == 2 and e.llm_cached == 0
    assert not any(v.startswith("pre-generation") for v in e.skipped.values())
    assert e.used == ("query", "anchor", "utterances", "reasoning")
    assert "llm" in e.timings_ms
    assert float(pq.vector @ pq.query_vector) < 0.9999


def test_the_gate_only_applies_to_safe_fusion() -> None:
    p, gen = make(pre_gate=0.5, fusion="paper")
    pq = p.personalize("u", "q")
    assert len(gen.prompts) == 2
    assert "utterances" in pq.explanation.used and not pq.explanation.skipped


def test_under_a_custom_fusion_rule_the_gate_still_applies_and_the_explanation_holds() -> None:
    """The gate applies under safe fusion whatever the rule (``pre_gate=None`` gives a rule of
    yours the feedback). The anchor such a rule was given and used was reported dropped by
    the gate (from a review): a term the rule used is never reported dropped."""
    from pbr_core.fusion import FusionInputs, FusionResult, fuse

    seen: list[FusionInputs] = []

    def paper_always(inputs: FusionInputs) -> FusionResult:
        seen.append(inputs)
        return fuse(inputs.q, anchor=inputs.anchor, f_avg=inputs.f_avg, r=inputs.r, mode="paper")

    for pre_gate, calls in ((0.75, 0), (None, 2)):
        gen = ScriptedGenerator(UTTER, REASON)
        cfg = PBRConfig(theta=0.0, k2=2, pre_gate=pre_gate)
        p = Personalizer(TableEmbedder(TABLE), gen, config=cfg, fusion_rule=paper_always)
        p.add_texts("u", ["h1", "h2", "h3"])
        e = p.personalize("u", "q").explanation
        assert len(gen.prompts) == calls and (seen[-1].f_avg is None) == (calls == 0)
        assert "anchor" in e.used
        assert not set(e.used) & (set(e.dropped) | set(e.skipped))


def test_pre_gate_is_validated() -> None:
    for bad in (1.5, -2.0, True, "0.5"):
        with pytest.raises(ValueError, match="pre_gate"):
            PBRConfig(pre_gate=bad)  # type: ignore[arg-type]
    assert PBRConfig().pre_gate == 0.52
