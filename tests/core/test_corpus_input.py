"""Bad input to a corpus write is refused with one clear ``ValueError`` on every entry point,
sync and async, before anything is embedded (an embedder call costs, and may send the text to an
API) and before anything is stored.

Found by review: the async write embedded first (a ``None`` text reached the embedder, which
raised ``AttributeError``), and the sync write read an item's metadata before checking it was a
mapping (``AttributeError`` where ``HistoryStore.upsert`` said "pass a dict").
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from doubles import BagOfWords

from pbr_core import HistoryItem, HistoryStore
from pbr_core.corpus import Corpus

BAD = {
    "a None text": [HistoryItem(id="a", text=None)],  # type: ignore[arg-type]
    "a bytes text": [HistoryItem(id="a", text=b"tea")],  # type: ignore[arg-type]
    "metadata that is a list": [HistoryItem(id="a", text="tea", metadata=["x"])],  # type: ignore[arg-type]
    "metadata that is None": [HistoryItem(id="a", text="tea", metadata=None)],  # type: ignore[arg-type]
    "a plain string": ["tea"],
    "an id twice": [HistoryItem(id="ok", text="again")],  # the good item's id
    "a blank text": [HistoryItem(id="a", text="  ")],
    "an empty id": [HistoryItem(id="", text="tea")],
}
SAYS = {
    "a None text": "has a NoneType text",
    "a bytes text": "has a bytes text",
    "metadata that is a list": "metadata of type list; pass a dict",
    "metadata that is None": "metadata of type NoneType; pass a dict",
    "a plain string": "is a str, not a HistoryItem",
    "an id twice": r"duplicate item ids in one batch: \['ok'\]",
    "a blank text": "item 'a' has empty text",
    "an empty id": "an item of user 'ann' has an empty id: give it one",
}


def _add(corpus: Corpus, items: list[Any], way: str) -> None:
    good = HistoryItem(id="ok", text="green tea")
    if way == "sync":
        corpus.add("ann", [good, *items])
    else:
        asyncio.run(corpus.aadd_many({"ann": [good, *items]}))


@pytest.mark.parametrize("way", ["sync", "async"])
@pytest.mark.parametrize("bad", list(BAD))
def test_bad_items_are_refused_before_anything_is_embedded_or_stored(bad: str, way: str) -> None:
    embedder = BagOfWords()
    corpus = Corpus(None, embedder=embedder, cache=HistoryStore())
    with pytest.raises(ValueError, match=SAYS[bad]):
        _add(corpus, BAD[bad], way)
    assert embedder.documents == 0
    assert corpus.history("ann") is None


@pytest.mark.parametrize("way", ["sync", "async"])
def test_a_batch_for_several_users_is_checked_whole_before_any_group_is_embedded(way: str) -> None:
    embedder = BagOfWords()
    corpus = Corpus(None, embedder=embedder, cache=HistoryStore())
    groups: dict[str, list[Any]] = {
        "ann": [HistoryItem(id="a", text="green tea")],
        "bob": [HistoryItem(id="b", text=None)],  # type: ignore[arg-type]
    }
    with pytest.raises(ValueError, match="of user 'bob' has a NoneType text"):
        if way == "sync":
            corpus.add_many(groups)
        else:
            asyncio.run(corpus.aadd_many(groups))
    assert embedder.documents == 0
    assert corpus.history("ann") is None


@pytest.mark.parametrize("way", ["sync", "async"])
def test_a_group_given_as_a_generator_is_written_whole(way: str) -> None:
    """Checking a batch before embedding it read a generator once, and the write found it empty:
    nothing written, no error (the async write lost it before the check too)."""
    corpus = Corpus(None, embedder=BagOfWords(), cache=HistoryStore())
    items = (HistoryItem(id=f"a{i}", text=f"note {i}") for i in range(3))
    if way == "sync":
        added = corpus.add_many({"ann": items})  # type: ignore[dict-item]
    else:
        added = asyncio.run(corpus.aadd_many({"ann": items}))  # type: ignore[dict-item]
    assert added == {"ann": ["a0", "a1", "a2"]}
    history = corpus.history("ann")
    assert history is not None and [it.id for it in history.items] == ["a0", "a1", "a2"]


@pytest.mark.parametrize("way", ["sync", "async"])
def test_an_empty_or_none_id_in_add_texts_is_no_id_and_gets_a_new_one(way: str) -> None:
    """As LangChain's stores read an empty id: no item is stored under "" or the string "None"
    (``str(None)``, which the ids once became)."""
    corpus = Corpus(None, embedder=BagOfWords(), cache=HistoryStore())
    texts, ids = ["green tea", "black tea", "oolong"], ["", None, "own"]
    if way == "sync":
        added = corpus.add_texts("ann", texts, ids=ids)  # type: ignore[arg-type]
    else:
        added = asyncio.run(corpus.aadd_texts("ann", texts, ids=ids))  # type: ignore[arg-type]
    assert added[2] == "own"
    assert all(len(new) == 32 and new not in ("", "None") for new in added[:2])
    assert len(set(added)) == 3
    history = corpus.history("ann")
    assert history is not None and [it.id for it in history.items] == added


def test_vectors_given_without_an_embedder_load_no_model_and_record_none(tmp_path) -> None:
    """Items given with their vectors (of the app's own model) to a corpus with no embedder
    loaded the embedded MiniLM only to read its window, and recorded it as the store's model,
    so the save would not load with the model that made the vectors (from a review)."""
    from conftest import HashEmbedder

    from pbr_core import Personalizer

    own = HashEmbedder(dim=16)
    texts = ["I am vegetarian and love pasta", "Ran 16 km this morning"]
    p = Personalizer()  # no embedder: the app passes vectors
    p.add_items(
        "maya",
        [HistoryItem(f"i{i}", t) for i, t in enumerate(texts)],
        vectors=own.embed_documents(texts),
    )
    assert p.corpus.embedder is None and p.store.embedding_model_id is None
    p.save(tmp_path / "s")
    assert len(Personalizer.load(tmp_path / "s", own).store.get("maya")) == 2
