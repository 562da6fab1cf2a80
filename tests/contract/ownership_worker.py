"""One worker process of an app: a pbr retriever over a Chroma server or a PostgreSQL database,
driven over stdin/stdout.

Started by ``tests/contract/test_ownership_processes.py``: ``python ownership_worker.py ADAPTER
PORT COLLECTION`` for Chroma, ``ADAPTER-pg URL COLLECTION`` for PostgreSQL + pgvector. Each stdin
line is a JSON request ``{"id", "op", "user", ...}``; requests run concurrently on a thread pool
(like a web server's workers) and each answer is one JSON line ``{"id", "ok", ...}``. The process
keeps nothing of its own that another process could not see: all state is in the server.
"""

from __future__ import annotations

import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

ANSWER_LOCK = threading.Lock()
DIM = 32


def langchain_worker(port: int, collection: str) -> Any:
    import chromadb
    from chromadb.config import Settings
    from langchain_chroma import Chroma
    from langchain_core.documents import Document
    from langchain_core.embeddings import DeterministicFakeEmbedding
    from langchain_core.language_models.fake import FakeListLLM

    from langchain_pbr import PBRRetriever

    emb = DeterministicFakeEmbedding(size=DIM)
    client = chromadb.HttpClient(
        host="127.0.0.1", port=port, settings=Settings(anonymized_telemetry=False)
    )
    store = Chroma(
        client=client,
        collection_name=collection,
        embedding_function=emb,
        collection_configuration={"hnsw": {"space": "cosine"}},
    )
    r = PBRRetriever(llm=FakeListLLM(responses=['["x"]', "y"]), embeddings=emb, vectorstore=store)

    def add(user: str, ids: list[str], texts: list[str]) -> None:
        docs = [Document(page_content=t) for t in texts]
        r.add_documents(docs, user_id=user, ids=ids)

    def delete(user: str, ids: list[str]) -> None:
        r.delete(ids, user_id=user)

    def query(user: str, k: int) -> list[dict[str, Any]]:
        docs = r.invoke("what do I like", user_id=user, k=k)
        return [{"id": d.id, "text": d.page_content, "owner": d.metadata["user_id"]} for d in docs]

    return add, delete, query


def llamaindex_worker(port: int, collection: str) -> Any:
    import chromadb
    from chromadb.config import Settings
    from llama_index.core import StorageContext, VectorStoreIndex
    from llama_index.core.llms import MockLLM
    from llama_index.core.schema import TextNode
    from llama_index.vector_stores.chroma import ChromaVectorStore

    from llamaindex_pbr import PBRRetriever
    from llamaindex_pbr.testing import HashEmbedding

    emb = HashEmbedding(dim=DIM)
    client = chromadb.HttpClient(
        host="127.0.0.1", port=port, settings=Settings(anonymized_telemetry=False)
    )
    col = client.get_or_create_collection(collection, configuration={"hnsw": {"space": "cosine"}})
    storage = StorageContext.from_defaults(vector_store=ChromaVectorStore(chroma_collection=col))
    index = VectorStoreIndex([], storage_context=storage, embed_model=emb)
    base = PBRRetriever(index, llm=MockLLM(max_tokens=8), embed_model=emb)

    def add(user: str, ids: list[str], texts: list[str]) -> None:
        base.for_user(user).add_nodes([TextNode(text=t, id_=i) for i, t in zip(ids, texts)])

    def delete(user: str, ids: list[str]) -> None:
        base.for_user(user).delete_nodes(ids)

    def query(user: str, k: int) -> list[dict[str, Any]]:
        got = base.for_user(user, similarity_top_k=k).retrieve("what do I like")
        return [
            {
                "id": n.node.node_id,
                "text": n.node.get_content(),
                "owner": n.node.metadata["user_id"],
            }
            for n in got
        ]

    return add, delete, query


def langchain_pg_worker(url: str, collection: str) -> Any:
    from langchain_core.documents import Document
    from langchain_core.embeddings import DeterministicFakeEmbedding
    from langchain_core.language_models.fake import FakeListLLM
    from langchain_postgres import PGVector

    from langchain_pbr import PBRRetriever

    emb = DeterministicFakeEmbedding(size=DIM)
    store = PGVector(embeddings=emb, connection=url, collection_name=collection)
    r = PBRRetriever(llm=FakeListLLM(responses=['["x"]', "y"]), embeddings=emb, vectorstore=store)

    def add(user: str, ids: list[str], texts: list[str]) -> None:
        docs = [Document(page_content=t) for t in texts]
        r.add_documents(docs, user_id=user, ids=ids)

    def delete(user: str, ids: list[str]) -> None:
        r.delete(ids, user_id=user)

    def query(user: str, k: int) -> list[dict[str, Any]]:
        docs = r.invoke("what do I like", user_id=user, k=k)
        return [{"id": d.id, "text": d.page_content, "owner": d.metadata["user_id"]} for d in docs]

    return add, delete, query


def llamaindex_pg_worker(url: str, table: str) -> Any:
    from llama_index.core import StorageContext, VectorStoreIndex
    from llama_index.core.llms import MockLLM
    from llama_index.core.schema import TextNode
    from llama_index.vector_stores.postgres import PGVectorStore
    from sqlalchemy import create_engine
    from sqlalchemy.ext.asyncio import create_async_engine

    from llamaindex_pbr import PBRRetriever
    from llamaindex_pbr.testing import HashEmbedding

    emb = HashEmbedding(dim=DIM)
    engine, async_engine = create_engine(url), create_async_engine(url)
    store = PGVectorStore(engine=engine, async_engine=async_engine, table_name=table, embed_dim=DIM)
    storage = StorageContext.from_defaults(vector_store=store)
    index = VectorStoreIndex([], storage_context=storage, embed_model=emb)
    base = PBRRetriever(index, llm=MockLLM(max_tokens=8), embed_model=emb)

    def add(user: str, ids: list[str], texts: list[str]) -> None:
        base.for_user(user).add_nodes([TextNode(text=t, id_=i) for i, t in zip(ids, texts)])

    def delete(user: str, ids: list[str]) -> None:
        base.for_user(user).delete_nodes(ids)

    def query(user: str, k: int) -> list[dict[str, Any]]:
        got = base.for_user(user, similarity_top_k=k).retrieve("what do I like")
        return [
            {
                "id": n.node.node_id,
                "text": n.node.get_content(),
                "owner": n.node.metadata["user_id"],
            }
            for n in got
        ]

    return add, delete, query


def main() -> None:
    adapter, target, collection = sys.argv[1], sys.argv[2], sys.argv[3]
    if adapter.endswith("-pg"):
        pg = langchain_pg_worker if adapter == "langchain-pg" else llamaindex_pg_worker
        add, delete, query = pg(target, collection)
    else:
        build = langchain_worker if adapter == "langchain" else llamaindex_worker
        add, delete, query = build(int(target), collection)

    def handle(line: str) -> None:
        request = json.loads(line)
        answer: dict[str, Any] = {"id": request["id"], "ok": True}
        try:
            op, user = request["op"], request["user"]
            if op == "add":
                add(user, request["ids"], request["texts"])
            elif op == "delete":
                delete(user, request["ids"])
            else:
                answer["hits"] = query(user, request["k"])
        except KeyError as exc:
            answer.update(ok=False, error="KeyError", message=str(exc))
        except Exception as exc:
            answer.update(ok=False, error=type(exc).__name__, message=str(exc)[:300])
        with ANSWER_LOCK:
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()

    print(json.dumps({"ready": True}), flush=True)
    with ThreadPoolExecutor(max_workers=4) as pool:
        for line in sys.stdin:
            if line.strip():
                pool.submit(handle, line)


if __name__ == "__main__":
    main()
