"""The data-ownership failures seen on a fresh clone, each as the behaviour that replaced it."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import HashEmbedder
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding, Embeddings
from langchain_core.indexing import InMemoryRecordManager, index
from langchain_core.language_models.fake import FakeListLLM
from langchain_core.vectorstores import InMemoryVectorStore, VectorStore
from llama_index.core import Document as LIDocument
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.llms import MockLLM
from llama_index.core.schema import TextNode
from llama_index.core.vector_stores.simple import SimpleVectorStore
from llama_index.core.vector_stores.types import BasePydanticVectorStore
from pydantic import Field, PrivateAttr

import langchain_pbr
import llamaindex_pbr
from llamaindex_pbr.testing import HashEmbedding
from pbr_core import PBRConfig, PersistenceError, Personalizer
from pbr_core.persist import current_snapshot

EMB = DeterministicFakeEmbedding(size=32)


class PromptLog(FakeListLLM):
    """An instant LLM that keeps every prompt it was sent."""

    seen: list[str] = Field(default_factory=list)

    def _call(self, prompt: str, *args: Any, **kwargs: Any) -> str:
        self.seen.append(prompt)
        return '["ok"]' if "candidates" in prompt.lower() else "ok"


def prompt_log() -> PromptLog:
    return PromptLog(responses=["x"])


# -- LangChain -----------------------------------------------------------------------------------
def test_the_issues_example_two_users_one_id_neither_loses_anything() -> None:
    r = langchain_pbr.PBRRetriever(
        llm=prompt_log(), embeddings=EMB, vectorstore=InMemoryVectorStore(EMB)
    )
    r.add_documents([Document(page_content="alice pin 4321")], user_id="alice", ids=["x"])
    r.add_documents([Document(page_content="bob jazz")], user_id="bob", ids=["x"])
    with pytest.raises(KeyError):
        r.delete(["y"], user_id="alice")
    r.delete(["x"], user_id="alice")
    assert [d.page_content for d in r.invoke("q", user_id="bob")] == ["bob jazz"]
    assert r.invoke("q", user_id="alice") == []


def test_from_documents_with_loader_ids_shared_by_two_users_keeps_both_corpora() -> None:
    docs = [
        Document(id=f"doc-{i}", page_content=f"{u} page {i}", metadata={"user_id": u})
        for u in ("alice", "bob")
        for i in range(3)
    ]
    store = InMemoryVectorStore(EMB)
    r = langchain_pbr.PBRRetriever.from_documents(
        docs, llm=prompt_log(), embeddings=EMB, vectorstore=store, k=10
    )
    assert len(store.store) == 6
    for u in ("alice", "bob"):
        got = r.invoke("page", user_id=u)
        assert sorted(d.id for d in got) == ["doc-0", "doc-1", "doc-2"]
        assert {d.page_content.split()[0] for d in got} == {u}


def test_documents_removed_by_the_indexing_api_never_reach_a_prompt() -> None:
    store = InMemoryVectorStore(EMB)

    def meta(source: str) -> dict[str, str]:
        return {"user_id": "alice", "source": source}

    manager = InMemoryRecordManager(namespace="notes")
    manager.create_schema()
    notes = [
        Document(
            page_content="alice secret code 7777", metadata={"user_id": "alice", "source": "a"}
        ),
        Document(page_content="alice likes tea", metadata={"user_id": "alice", "source": "b"}),
    ]
    index(notes, manager, store, cleanup="full", source_id_key="source", key_encoder="sha256")
    llm = prompt_log()
    r = langchain_pbr.PBRRetriever(llm=llm, embeddings=EMB, vectorstore=store, k=10)
    assert len(r.invoke("secret", user_id="alice")) == 2  # indexed by someone else: seen
    index(notes[1:], manager, store, cleanup="full", source_id_key="source", key_encoder="sha256")
    llm.seen.clear()
    got = r.invoke("secret", user_id="alice")
    assert [d.page_content for d in got] == ["alice likes tea"]
    assert llm.seen and not any("7777" in p for p in llm.seen)


class OpaqueStore(VectorStore):
    """A store pbr cannot list (any VectorStore other than InMemory / Chroma), backed by one."""

    def __init__(self, embedding: Embeddings) -> None:
        self.inner = InMemoryVectorStore(embedding)

    @property
    def embeddings(self) -> Embeddings:
        return self.inner.embeddings

    def add_texts(self, texts: Any, metadatas: Any = None, **kwargs: Any) -> list[str]:
        return self.inner.add_texts(texts, metadatas, **kwargs)

    def add_documents(self, documents: Any, **kwargs: Any) -> list[str]:
        return self.inner.add_documents(documents, **kwargs)

    def delete(self, ids: Any = None, **kwargs: Any) -> None:
        self.inner.delete(ids)

    def similarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        return self.inner.similarity_search(query, k, **kwargs)

    def similarity_search_with_score_by_vector(
        self, embedding: list[float], k: int = 4, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        return self.inner.similarity_search_with_score_by_vector(embedding, k, **kwargs)

    @classmethod
    def from_texts(cls, texts: Any, embedding: Embeddings, metadatas: Any = None, **kw: Any) -> Any:
        raise NotImplementedError


def test_a_store_that_cannot_list_keeps_pbrs_history_as_the_record() -> None:
    store = OpaqueStore(EMB)

    def owned(user: str) -> dict[str, Any]:  # the inner in-memory store filters with a callable
        return {"filter": lambda doc: doc.metadata.get("user_id") == user}

    r = langchain_pbr.PBRRetriever(
        llm=prompt_log(), embeddings=EMB, vectorstore=store, k=10, filter_builder=owned
    )
    assert not r.corpus.verified
    r.add_documents([Document(page_content="alice runs")], user_id="alice", ids=["x"])
    r.add_documents([Document(page_content="bob swims")], user_id="bob", ids=["x"])
    assert [d.page_content for d in r.invoke("q", user_id="alice")] == ["alice runs"]
    r.delete(["x"], user_id="bob")  # through the retriever: store and history in step
    assert r.invoke("q", user_id="bob") == [] and len(store.inner.store) == 1
    # Documented limit: a delete made around pbr is not seen by its history (the search, which
    # runs in the store, no longer returns the item).
    store.delete(list(store.inner.store))
    assert "alice" in r.history and r.invoke("q", user_id="alice") == []


# -- LlamaIndex ----------------------------------------------------------------------------------
def test_wrapping_a_chroma_index_built_with_from_documents_gives_every_user_their_history(
    shared_chroma: Any,
) -> None:
    from llama_index.vector_stores.chroma import ChromaVectorStore

    emb = HashEmbedding(dim=32)
    collection = shared_chroma.client().create_collection(f"wrap-{uuid.uuid4().hex[:8]}")
    storage = StorageContext.from_defaults(
        vector_store=ChromaVectorStore(chroma_collection=collection)
    )
    docs = [
        # distinct document ids: LlamaIndex's own docstore keys documents globally
        LIDocument(text=f"{u} diary entry {i}", id_=f"{u}-doc-{i}", metadata={"user_id": u})
        for u in ("ann", "ben")
        for i in range(3)
    ]
    built = VectorStoreIndex.from_documents(docs, storage_context=storage, embed_model=emb)
    base = llamaindex_pbr.PBRRetriever(
        built, llm=MockLLM(max_tokens=4), embed_model=emb, config=PBRConfig(explain="all")
    )
    ann = base.for_user("ann", similarity_top_k=10)
    got = ann.retrieve("diary")
    assert sorted(n.node.get_content() for n in got) == [f"ann diary entry {i}" for i in range(3)]
    assert [h["text"] for h in got[0].node.metadata["pbr"]["related"]]  # history, not empty
    built.delete_ref_doc("ann-doc-0")  # through the index itself, not through pbr
    texts = [n.node.get_content() for n in ann.retrieve("diary")]
    assert sorted(texts) == [f"ann diary entry {i}" for i in (1, 2)]
    related = ann.retrieve("diary")[0].node.metadata["pbr"]["related"]
    assert "ann diary entry 0" not in {h["text"] for h in related}


def test_a_persist_that_dies_midway_leaves_the_previous_save_loadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    emb = HashEmbedding(dim=32)
    base = llamaindex_pbr.PBRRetriever.from_defaults(
        nodes=[], llm=MockLLM(max_tokens=4), embed_model=emb
    )
    ann = base.for_user("ann")
    ann.add_nodes([TextNode(text="first save", id_="a1")])
    ann.persist(tmp_path / "pbr")
    ann.add_nodes([TextNode(text="second save", id_="a2")])

    def die(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(type(base.index.storage_context), "persist", die)
    with pytest.raises(KeyboardInterrupt):
        ann.persist(tmp_path / "pbr")
    monkeypatch.undo()
    loaded = llamaindex_pbr.PBRRetriever.from_persist_dir(
        tmp_path / "pbr", llm=MockLLM(max_tokens=4), embed_model=emb
    )
    assert [n.node.get_content() for n in loaded.for_user("ann").retrieve("save")] == ["first save"]


def test_a_damaged_index_file_is_a_persistence_error_naming_it(tmp_path: Path) -> None:
    emb = HashEmbedding(dim=32)
    base = llamaindex_pbr.PBRRetriever.from_defaults(
        nodes=[], llm=MockLLM(max_tokens=4), embed_model=emb
    )
    base.for_user("ann").add_nodes([TextNode(text="kept", id_="a1")])
    base.persist(tmp_path / "pbr")
    docstore = current_snapshot(tmp_path / "pbr") / "index" / "docstore.json"
    docstore.write_bytes(b"")  # a 0-byte file, as a kill mid-write used to leave
    with pytest.raises(PersistenceError, match="index"):
        llamaindex_pbr.PBRRetriever.from_persist_dir(
            tmp_path / "pbr", llm=MockLLM(max_tokens=4), embed_model=emb
        )


@pytest.mark.parametrize("damage", ["vectors", "docstore text", "manifest"])
def test_an_index_file_damaged_but_still_valid_json_is_detected(
    damage: str, tmp_path: Path
) -> None:
    import json

    emb = HashEmbedding(dim=32)
    base = llamaindex_pbr.PBRRetriever.from_defaults(
        nodes=[], llm=MockLLM(max_tokens=4), embed_model=emb
    )
    base.for_user("ann").add_nodes([TextNode(text="kept", id_="a1")])
    base.persist(tmp_path / "pbr")
    snapshot = current_snapshot(tmp_path / "pbr")
    if damage == "vectors":  # one number of one vector changed: the file still parses
        path = snapshot / "index" / "default__vector_store.json"
        data = json.loads(path.read_text())
        vectors = data["embedding_dict"]
        first = next(iter(vectors))
        vectors[first][0] = -vectors[first][0]
    elif damage == "docstore text":
        path = snapshot / "index" / "docstore.json"
        data = json.loads(path.read_text().replace("kept", "edited"))
    else:  # a setting changed by hand
        path = snapshot / "pbr_retriever.json"
        data = {**json.loads(path.read_text()), "similarity_top_k": 99}
    path.write_text(json.dumps(data))
    with pytest.raises(PersistenceError, match=path.name):
        llamaindex_pbr.PBRRetriever.from_persist_dir(
            tmp_path / "pbr", llm=MockLLM(max_tokens=4), embed_model=emb
        )


# -- the core ------------------------------------------------------------------------------------
def test_an_empty_first_add_leaves_the_user_usable() -> None:
    p = Personalizer(HashEmbedder())
    assert p.add_texts("u", []) == []
    p.add_texts("u", ["a real item", "another one"])
    assert len(p.store.get("u")) == 2


class OpaqueIndexStore(BasePydanticVectorStore):
    """A LlamaIndex store pbr cannot list (neither Simple nor Chroma), backed by a simple one."""

    stores_text: bool = False
    _inner: SimpleVectorStore = PrivateAttr(default_factory=SimpleVectorStore)

    @property
    def client(self) -> Any:
        return None

    def add(self, nodes: Any, **kwargs: Any) -> list[str]:
        return self._inner.add(nodes, **kwargs)

    def delete(self, ref_doc_id: str, **kwargs: Any) -> None:
        self._inner.delete(ref_doc_id, **kwargs)

    def delete_nodes(self, node_ids: Any = None, filters: Any = None, **kwargs: Any) -> None:
        self._inner.delete_nodes(node_ids, filters, **kwargs)

    def query(self, query: Any, **kwargs: Any) -> Any:
        return self._inner.query(query, **kwargs)


def test_a_llamaindex_store_that_cannot_list_reads_the_docstore_once_and_keeps_the_record() -> None:
    emb = HashEmbedding(dim=32)
    storage = StorageContext.from_defaults(vector_store=OpaqueIndexStore())
    nodes = [
        TextNode(text=f"{u} memo {i}", id_=f"{u}-{i}", metadata={"user_id": u})
        for u in ("ann", "ben")
        for i in range(2)
    ]
    built = VectorStoreIndex(nodes, storage_context=storage, embed_model=emb)
    base = llamaindex_pbr.PBRRetriever(built, llm=MockLLM(max_tokens=4), embed_model=emb)
    assert not base._shared.corpus.verified
    assert sorted(base.personalizer.store.users()) == ["ann", "ben"]  # from the docstore
    ann = base.for_user("ann", similarity_top_k=10)
    ann.add_nodes([TextNode(text="ann memo 9", id_="ben-0")])  # ann's own "ben-0"
    got = sorted(n.node.get_content() for n in ann.retrieve("memo"))
    assert got == ["ann memo 0", "ann memo 1", "ann memo 9"]
    ann.delete_nodes(["ben-0"])
    assert len(base.for_user("ben", similarity_top_k=10).retrieve("memo")) == 2


def test_a_staleness_window_trades_other_workers_freshness_for_fewer_listings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pbr_core.corpus as corpus_mod
    from langchain_pbr.stores import host_records
    from pbr_core.corpus import Corpus

    clock = [1000.0]
    monkeypatch.setattr(corpus_mod.time, "monotonic", lambda: clock[0])
    store = InMemoryVectorStore(EMB)
    first = langchain_pbr.PBRRetriever(llm=prompt_log(), embeddings=EMB, vectorstore=store, k=10)
    lazy = Corpus(host_records(store, "user_id"), embedder=EMB, max_staleness_s=5.0)
    second = langchain_pbr.PBRRetriever(
        llm=prompt_log(), embeddings=EMB, vectorstore=store, k=10, corpus=lazy
    )
    first.add_documents([Document(page_content="ann one")], user_id="ann", ids=["1"])
    assert len(second.invoke("q", user_id="ann")) == 1  # listed now
    first.add_documents([Document(page_content="ann two")], user_id="ann", ids=["2"])
    assert len(second.invoke("q", user_id="ann")) == 1  # within 5 s: not listed again
    second.add_documents([Document(page_content="ann three")], user_id="ann", ids=["3"])
    assert len(second.invoke("q", user_id="ann")) == 2  # its own write: seen at once
    clock[0] += 5.5
    assert len(second.invoke("q", user_id="ann")) == 3  # the window is over: listed again
    with pytest.raises(ValueError, match="max_staleness_s"):
        Corpus(None, max_staleness_s=-1)


def test_loading_a_chroma_backed_save_without_a_loader_says_what_to_pass(
    shared_chroma: Any, tmp_path: Path
) -> None:
    from llama_index.vector_stores.chroma import ChromaVectorStore

    emb = HashEmbedding(dim=32)
    collection = shared_chroma.client().create_collection(f"persist-{uuid.uuid4().hex[:8]}")
    storage = StorageContext.from_defaults(
        vector_store=ChromaVectorStore(chroma_collection=collection)
    )
    index = VectorStoreIndex([], storage_context=storage, embed_model=emb)
    base = llamaindex_pbr.PBRRetriever(index, llm=MockLLM(max_tokens=4), embed_model=emb)
    base.for_user("ann").add_nodes([TextNode(text="kept in chroma", id_="a1")])
    base.persist(tmp_path / "pbr")
    with pytest.raises(PersistenceError, match="vector_store_loader"):
        llamaindex_pbr.PBRRetriever.from_persist_dir(
            tmp_path / "pbr", llm=MockLLM(), embed_model=emb
        )
    loaded = llamaindex_pbr.PBRRetriever.from_persist_dir(
        tmp_path / "pbr",
        llm=MockLLM(max_tokens=4),
        embed_model=emb,
        vector_store_loader=lambda _folder: ChromaVectorStore(chroma_collection=collection),
    )
    assert [n.node.get_content() for n in loaded.retrieve("kept", user_id="ann")] == [
        "kept in chroma"
    ]


# -- found by review (2026-12-03) ----------------------------------------------------------------
def test_a_user_emptied_in_the_store_after_a_save_is_not_served_from_the_save(
    tmp_path: Path,
) -> None:
    store = InMemoryVectorStore(EMB)
    r = langchain_pbr.PBRRetriever(llm=prompt_log(), embeddings=EMB, vectorstore=store, k=10)
    r.add_documents([Document(page_content="alice secret 7777")], user_id="alice", ids=["a1"])
    r.add_documents([Document(page_content="bob jazz")], user_id="bob", ids=["b1"])
    r.save(tmp_path / "pbr")
    r.delete(["a1"], user_id="alice")  # every item of alice's, after the save
    llm = prompt_log()
    loaded = langchain_pbr.PBRRetriever.load(
        tmp_path / "pbr", llm=llm, embeddings=EMB, vectorstore=store, k=10
    )
    assert loaded.invoke("secret", user_id="alice") == []
    assert not any("7777" in p for p in llm.seen)
    assert [d.page_content for d in loaded.invoke("jazz", user_id="bob")] == ["bob jazz"]


def test_a_llamaindex_user_emptied_through_the_index_after_loading_has_no_history(
    tmp_path: Path,
) -> None:
    emb = HashEmbedding(dim=32)
    nodes = [
        TextNode(text="alice secret plan", id_="a1", metadata={"user_id": "alice"}),
        TextNode(text="bob thing", id_="b1", metadata={"user_id": "bob"}),
    ]
    base = llamaindex_pbr.PBRRetriever(
        VectorStoreIndex(nodes, embed_model=emb), llm=MockLLM(max_tokens=4), embed_model=emb
    )
    assert len(base.retrieve("secret", user_id="alice")) == 1  # alice's history is in the save
    base.persist(tmp_path / "pbr")
    loaded = llamaindex_pbr.PBRRetriever.from_persist_dir(
        tmp_path / "pbr", llm=MockLLM(max_tokens=4), embed_model=emb
    )
    data = loaded.index.vector_store.data
    alice = [k for k, m in data.metadata_dict.items() if m.get("user_id") == "alice"]
    loaded.index.delete_nodes(alice, delete_from_docstore=True)
    assert loaded.retrieve("secret", user_id="alice") == []
    assert loaded._shared.corpus.history("alice") is None
    assert [n.node.get_content() for n in loaded.retrieve("thing", user_id="bob")] == ["bob thing"]


def _lc_with_items() -> langchain_pbr.PBRRetriever:
    r = langchain_pbr.PBRRetriever(
        llm=prompt_log(), embeddings=EMB, vectorstore=InMemoryVectorStore(EMB), k=10
    )
    docs = [Document(page_content=t) for t in ("x one", "y two", "xy three")]
    r.add_documents(docs, user_id="alice", ids=["x", "y", "xy"])
    return r


def _li_with_items() -> llamaindex_pbr.PBRRetriever:
    emb = HashEmbedding(dim=32)
    r = llamaindex_pbr.PBRRetriever(
        VectorStoreIndex([], embed_model=emb), llm=MockLLM(max_tokens=4), embed_model=emb
    )
    nodes = [TextNode(text=t, id_=i) for t, i in (("x one", "x"), ("y two", "y"), ("xy 3", "xy"))]
    r.for_user("alice").add_nodes(nodes)
    return r


def _core_with_items() -> Personalizer:
    p = Personalizer(HashEmbedder())
    p.add_texts("alice", ["x one", "y two", "xy three"], ids=["x", "y", "xy"])
    return p


@pytest.mark.parametrize(
    ("make", "delete", "history"),
    [
        (_core_with_items, lambda p: p.delete("alice", "xy"), lambda p: p.store.get("alice")),
        (
            _lc_with_items,
            lambda r: r.delete("xy", user_id="alice"),
            lambda r: r.history.get("alice"),
        ),
        (
            _li_with_items,
            lambda r: r.for_user("alice").delete_nodes("xy"),
            lambda r: r.personalizer.store.get("alice"),
        ),
    ],
    ids=["core", "langchain", "llamaindex"],
)
def test_a_bare_string_of_ids_is_refused_not_read_as_its_letters(
    make: Any, delete: Any, history: Any
) -> None:
    owner = make()
    with pytest.raises(TypeError, match=r"single string 'xy'; pass \['xy'\]"):
        delete(owner)
    assert sorted(i.id for i in history(owner).items) == ["x", "xy", "y"]  # nothing removed


def test_a_bare_string_of_texts_or_ids_is_refused_when_adding() -> None:
    p = Personalizer(HashEmbedder())
    with pytest.raises(TypeError, match="texts must be a list"):
        p.add_texts("alice", "hello")
    r = _lc_with_items()
    with pytest.raises(TypeError, match="ids must be a list"):
        r.add_documents(
            [Document(page_content="a"), Document(page_content="b")], user_id="bob", ids="ab"
        )
    assert list(p.store.users()) == []  # nothing stored
    with pytest.raises(ValueError, match="text"):  # elements are not converted to text either
        p.add_texts("alice", [None])  # type: ignore[list-item]
    assert "bob" not in r.history.users()


def test_an_item_recorded_over_a_store_that_cannot_list_is_deleted_from_it_after_a_restart(
    tmp_path: Path,
) -> None:
    store = OpaqueStore(EMB)
    before = Document(id="d1", page_content="alice old note", metadata={"user_id": "alice"})
    store.add_documents([before], ids=["d1"])  # in the store before pbr, under its own key
    r = langchain_pbr.PBRRetriever(llm=prompt_log(), embeddings=EMB, vectorstore=store, k=10)
    r.add_documents([before], user_id="alice", add_to_vectorstore=False)  # recorded, as documented
    r.add_documents([Document(page_content="alice new note")], user_id="alice", ids=["d2"])
    r.save(tmp_path / "pbr")
    loaded = langchain_pbr.PBRRetriever.load(
        tmp_path / "pbr", llm=prompt_log(), embeddings=EMB, vectorstore=store, k=10
    )
    loaded.add_documents(
        [Document(page_content="alice old note, edited")], user_id="alice", ids=["d1"]
    )  # replaces the record where it is, no second copy
    assert sorted(store.inner.store) == sorted(["d1", loaded.corpus.key_of("alice", "d2")])
    assert store.inner.store["d1"]["text"] == "alice old note, edited"
    loaded.delete(["d1", "d2"], user_id="alice")
    assert store.inner.store == {}  # nothing of alice's left behind in the store
    assert len(loaded.history.get("alice")) == 0  # the record (this store cannot list) is empty


def _filtered_retriever(store: OpaqueStore) -> langchain_pbr.PBRRetriever:
    """A retriever over a store pbr cannot list, its users kept apart by a filter_builder."""

    def owned(user: str) -> dict[str, Any]:
        return {"filter": lambda doc: doc.metadata.get("user_id") == user}

    return langchain_pbr.PBRRetriever(
        llm=prompt_log(), embeddings=EMB, vectorstore=store, k=10, filter_builder=owned
    )


def _recorded_again(
    store: OpaqueStore, docs: list[Document], item_id: str
) -> langchain_pbr.PBRRetriever:
    """A new process's retriever that records what ``store`` holds as alice's ``item_id``,
    without writing it."""
    again = _filtered_retriever(store)
    again.add_documents(docs, user_id="alice", ids=[item_id], add_to_vectorstore=False)
    return again


def _texts(retriever: langchain_pbr.PBRRetriever, query: str) -> list[str]:
    return [d.page_content for d in retriever.invoke(query, user_id="alice")]


def test_documents_pbr_wrote_recorded_again_without_writing_are_found_and_deleted() -> None:
    """A new process without the saved history records what a store pbr cannot list holds
    (``add_to_vectorstore=False``): a document pbr wrote (its metadata names its id) is held
    under pbr's scoped key, so it is ranked and deleted (it was keyed by the bare id: found by
    no search, deleted by no delete)."""
    store = OpaqueStore(EMB)
    first = _filtered_retriever(store)
    first.add_documents([Document("alice likes green tea")], user_id="alice", ids=["n1"])
    for id_given in (True, False):  # the store's key as Document.id, or no Document.id
        rows = list(store.inner.store.items())
        docs = [
            Document(r["text"], id=k if id_given else None, metadata=r["metadata"]) for k, r in rows
        ]
        second = _recorded_again(store, docs, "n1")
        assert _texts(second, "tea") == ["alice likes green tea"]
    second.delete(["n1"], user_id="alice")
    assert list(store.inner.store) == []


def test_a_document_recorded_under_an_id_of_its_own_is_found_by_its_store_key() -> None:
    """A document the store holds under its own key, recorded as the user's item of another id
    (``ids=``): the store's hit has no pbr id, and was looked up by its key, so the item was
    shown to the LLM as history and deletable but never returned; after a save and load too."""
    store = OpaqueStore(EMB)
    doc = Document("alice likes green tea", id="K1", metadata={"user_id": "alice"})
    store.inner.add_documents([doc])
    first = _filtered_retriever(store)
    assert first.add_documents([doc], user_id="alice", ids=["mine"], add_to_vectorstore=False) == [
        "mine"
    ]
    assert [d.id for d in first.invoke("tea", user_id="alice")] == ["mine"]
    with tempfile.TemporaryDirectory() as folder:
        first.save(folder)
        loaded = langchain_pbr.PBRRetriever.load(
            folder,
            llm=prompt_log(),
            embeddings=EMB,
            vectorstore=store,
            k=10,
            filter_builder=first.filter_builder,
        )
        assert [d.id for d in loaded.invoke("tea", user_id="alice")] == ["mine"]
    loaded.delete(["mine"], user_id="alice")
    assert list(store.inner.store) == []


def test_documents_read_back_from_the_store_are_recorded_under_their_users_ids() -> None:
    """Without ``ids``: a document read back from the store has pbr's scoped key as its
    ``Document.id`` and its user's id in its metadata; it is recorded as the user's item of
    that id (LangChain refused pbr's own metadata key; LlamaIndex recorded it, but returned the
    scoped key, which ``delete_nodes`` refused), in both frameworks by one rule."""
    store = OpaqueStore(EMB)
    _filtered_retriever(store).add_documents(
        [Document("alice likes green tea")], user_id="alice", ids=["n1"]
    )
    docs = [Document(r["text"], id=k, metadata=r["metadata"]) for k, r in store.inner.store.items()]
    again = _filtered_retriever(store)
    assert again.add_documents(docs, user_id="alice", add_to_vectorstore=False) == ["n1"]
    assert [d.id for d in again.invoke("tea", user_id="alice")] == ["n1"]
    again.delete(["n1"], user_id="alice")
    assert list(store.inner.store) == []

    base = llamaindex_pbr.PBRRetriever.from_defaults(
        nodes=[TextNode(id_="n1", text="alice likes green tea", metadata={"user_id": "alice"})],
        llm=MockLLM(),
        embed_model=HashEmbedding(dim=16),
        user_id="alice",
    )
    held = list(base.index.docstore.docs.values())  # as the index holds them: pbr's keys
    assert [n.node_id for n in held] != ["n1"]
    recorded = base.add_nodes(held, insert=False)
    assert recorded == ["n1"]
    base.delete_nodes(recorded)
    assert base.retrieve("tea") == []


def test_a_document_pbr_rewrote_under_the_users_own_key_is_recorded_again_under_it() -> None:
    """Recorded under its own key "d1", then edited through pbr (rewritten under "d1", its
    metadata naming "d1"): a new process recording what the store holds takes the store's key,
    the Document.id (a rule reading the metadata took pbr's scoped key: hidden and
    undeletable)."""
    store = OpaqueStore(EMB)
    before = Document(id="d1", page_content="alice old note", metadata={"user_id": "alice"})
    store.add_documents([before], ids=["d1"])
    first = _filtered_retriever(store)
    first.add_documents([before], user_id="alice", add_to_vectorstore=False)
    first.add_documents([Document("alice note, edited")], user_id="alice", ids=["d1"])
    docs = [Document(r["text"], id=k, metadata=r["metadata"]) for k, r in store.inner.store.items()]
    second = _recorded_again(store, docs, "d1")
    assert _texts(second, "note") == ["alice note, edited"]
    second.delete(["d1"], user_id="alice")
    assert list(store.inner.store) == []


@pytest.mark.parametrize("key", ["pbr_id", "timestamp"])
def test_a_user_key_pbr_keeps_for_itself_is_refused(key: str) -> None:
    """Every record's metadata holds pbr's item id and timestamp: an owner named under either
    key was overwritten by the item's id (alice's note with id "bob" became bob's)."""
    from pbr_core.corpus import Corpus

    with pytest.raises(ValueError, match=f"user_key '{key}' is a metadata key pbr keeps"):
        Corpus(None, embedder=HashEmbedder(), user_key=key)
    with pytest.raises(ValueError, match="pbr keeps for itself"):
        langchain_pbr.PBRRetriever(
            embeddings=EMB, vectorstore=InMemoryVectorStore(EMB), user_key=key
        )
    with pytest.raises(ValueError, match="pbr keeps for itself"):
        llamaindex_pbr.PBRRetriever.from_defaults(
            nodes=[TextNode(text="x", metadata={key: "alice"})],
            embed_model=HashEmbedding(dim=8),
            llm=MockLLM(),
            user_id_key=key,
        )
