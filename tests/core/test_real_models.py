"""The method with the real embedded models on the shipped sample corpus (slow, runs in CI)."""

from __future__ import annotations

import io

import pytest

from pbr_core import PBRConfig
from pbr_core.demo import build_personalizer, load_sample_corpus, run_demo

pytestmark = pytest.mark.slow

# Candidates both users could be offered: the same question must rank them differently per user.
SHARED = {
    "opt-salad": "Dinner idea: a quinoa and roasted vegetable bowl with a light lemon dressing.",
    "opt-fish": "Dinner idea: steamed salmon with broccoli and brown rice, high in protein.",
    "opt-hotpot": "Dinner idea: a fiery Sichuan hotpot with tripe and numbing peppercorns.",
    "opt-tacos": "Dinner idea: street-style tacos with grasshoppers, salsa roja and lime.",
    "opt-burger": "Dinner idea: a classic cheeseburger with fries.",
}
QUESTION = "What should I have for dinner tonight?"


@pytest.fixture(scope="module")
def personalizer():
    p = build_personalizer()
    for user in load_sample_corpus().users:
        p.add_texts(user, list(SHARED.values()), ids=list(SHARED))
    return p


def shared_ranking(p, user: str, config: PBRConfig, **kwargs) -> list[str]:
    hits = p.search(user, QUESTION, k=100, config=config, **kwargs).hits
    return [h.id for h in hits if h.id in SHARED]


def test_plain_ranks_the_shared_options_alike_and_pbr_ranks_them_per_user(personalizer) -> None:
    plain = PBRConfig(fusion="plain")
    assert shared_ranking(personalizer, "maya", plain) == shared_ranking(personalizer, "leo", plain)
    anchor_only = PBRConfig(fusion="no_prf")  # deterministic: no LLM involved
    maya = shared_ranking(personalizer, "maya", anchor_only)
    leo = shared_ranking(personalizer, "leo", anchor_only)
    assert maya != leo
    # Each user's own style of dinner rises above where the other user's anchor puts it.
    assert maya.index("opt-fish") < leo.index("opt-fish")  # steamed salmon, brown rice
    assert leo.index("opt-tacos") < maya.index("opt-tacos")  # grasshopper tacos


def test_the_embedded_llm_writes_parseable_pseudo_feedback(personalizer) -> None:
    pq = personalizer.personalize("maya", QUESTION, config=PBRConfig(fusion="paper"))
    expl = pq.explanation
    assert "utterances" not in expl.dropped, expl.dropped
    assert len(expl.pseudo_utterances) >= 2
    assert all(len(u) >= 3 for u in expl.pseudo_utterances)
    assert "utterances" in expl.used


def test_the_demo_runs_end_to_end_offline(tmp_path) -> None:
    out = io.StringIO()
    rows = run_demo(k=3, questions=1, cache_path=str(tmp_path / "gen.jsonl"), stream=out)
    assert [r["user"] for r in rows] == ["maya", "leo"]
    text = out.getvalue()
    assert "hybrid + PBR" in text and "pseudo utterance" in text
    assert (tmp_path / "gen.jsonl").stat().st_size > 0
