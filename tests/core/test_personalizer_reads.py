"""Every entry point of the :class:`Personalizer` reads the user as the host store holds them,
and one request personalizes on the snapshot it ranks.

An item deleted through the store itself (another worker, the store's own API) never reaches an
LLM prompt or an explanation (docs/data-ownership.md): ``personalize``, ``apersonalize``,
``anchor_items`` and ``feedback_prompts`` once read a cached user without listing the host, so
such an item stayed in the related history and in the prompt sent to the LLM.
"""

from __future__ import annotations

import asyncio
from typing import Any

from conftest import HashEmbedder, ScriptedGenerator
from doubles import BagOfWords, ListingHost

from pbr_core import HistoryStore, PBRConfig, Personalizer
from pbr_core.corpus import Corpus, scoped_key

NOTES = {"pin": "my bank pin is 1234", "r": "I like rust", "t": "I like green tea"}


def _personalizer_with_a_deleted_pin(**kwargs: Any) -> Personalizer:
    """Ann's notes, cached by a first read; then her pin deleted through the store itself."""
    host = ListingHost()
    corpus = Corpus(host, embedder=HashEmbedder(), cache=HistoryStore())
    corpus.add_texts("ann", list(NOTES.values()), ids=list(NOTES))
    p = Personalizer(corpus=corpus, generator=ScriptedGenerator('["x"]', "r"), **kwargs)
    assert "pin" in [h.id for h in p.personalize("ann", "my pin").explanation.related]
    del host.rows[scoped_key("ann", "pin")]
    return p


def test_personalize_drops_an_item_deleted_through_the_store() -> None:
    p = _personalizer_with_a_deleted_pin(config=PBRConfig(fusion="no_prf"))
    assert [h.id for h in p.personalize("ann", "what is my pin").explanation.related] == ["r", "t"]


def test_apersonalize_drops_an_item_deleted_through_the_store() -> None:
    p = _personalizer_with_a_deleted_pin(config=PBRConfig(fusion="no_prf"))
    pq = asyncio.run(p.apersonalize("ann", "what is my pin"))
    assert "pin" not in [h.id for h in pq.explanation.related]


def test_the_anchor_holds_no_item_deleted_through_the_store() -> None:
    p = _personalizer_with_a_deleted_pin()
    assert sorted(h.id for h in p.anchor_items("ann")) == ["r", "t"]


def test_no_prompt_to_the_llm_holds_an_item_deleted_through_the_store() -> None:
    p = _personalizer_with_a_deleted_pin()  # the default fusion calls the LLM
    prompts = p.feedback_prompts("ann", "what is my pin")
    assert prompts is not None and "1234" not in "".join(prompts)


def test_a_search_personalizes_on_the_snapshot_it_ranks() -> None:
    p = Personalizer(embedder=BagOfWords(), config=PBRConfig(fusion="no_prf"))
    p.add_texts("ann", ["likes rust", "likes tea"], ids=["r", "t"])
    personalize = p.personalize

    def write_between(user_id: str, query: str, **kwargs: Any) -> Any:
        p.add_texts("ann", ["rust borrow checker notes"], ids=["new"])  # lands mid-request
        return personalize(user_id, query, **kwargs)

    p.personalize = write_between  # type: ignore[method-assign]
    got = p.search("ann", "rust borrow", k=5)
    related = [h.id for h in got.personalized.explanation.related]
    assert "new" not in related and "new" not in [h.id for h in got.hits]
    assert "new" in [h.id for h in p.search("ann", "rust borrow", k=5).hits]  # the next one sees it
