"""One worker process of an app: a pbr retriever over a Chroma server or a PostgreSQL database,
driven over stdin/stdout.

Started by ``tests/contract/test_ownership_processes.py``: ``python ownership_worker.py ADAPTER
PORT COLLECTION`` for Chroma, ``ADAPTER-pg URL COLLECTION`` for PostgreSQL + pgvector (the
adapter's operations are the same over both; only the store differs). Each stdin
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


def chroma_client(port: int) -> Any:
    import chromadb
    from chromadb.config import Settings

    return chromadb.HttpClient(
        host="127.0.0.1", port=port, settings=Settings(anonymized_telemetry=False)
    )


def langchain_store(target: str, collection: str, emb: Any) -> Any:
    """LangChain's Chroma (``target``: the server's port) or PGVector (``target``: a URL)."""
    if target.isdigit():
        from langchain_chroma import Chroma

        return Chroma(
            client=chroma_client(int(target)),
            collection_name=collection,
            embedding_function=emb,
            collection_configuration={"hnsw": {"space": "cosine"}},
        )
    from langchain_postgres import PGVector

    return PGVector(embeddings=emb, connection=target, collection_name=collection)


def llamaindex_store(target: str, collection: str) -> Any:
    """LlamaIndex's ChromaVectorStore (``target``: the port) or PGVectorStore (a URL)."""
    if target.isdigit():
        from llama_index.vector_stores.chroma import ChromaVectorStore

        col = chroma_client(int(target)).get_or_create_collection(
            collection, configuration={"hnsw": {"space": "cosine"}}
        )
        return ChromaVectorStore(chroma_collection=col)
    from llama_index.vector_stores.postgres import PGVectorStore
    from sqlalchemy import create_engine
    from sqlalchemy.ext.asyncio import create_async_engine

    engine, async_engine = create_engine(target), create_async_engine(target)
    return PGVectorStore(
        engine=engine, async_engine=async_engine, table_name=collection, embed_dim=DIM
    )


def langchain_worker(target: str, collection: str) -> Any:
    from langchain_core.documents import Document
    from langchain_core.embeddings import DeterministicFakeEmbedding
    from langchain_core.language_models.fake import FakeListLLM

    from langchain_pbr import PBRRetriever

    emb = DeterministicFakeEmbedding(size=DIM)
    store = langchain_store(target, collection, emb)
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


def llamaindex_worker(target: str, collection: str) -> Any:
    from llama_index.core import StorageContext, VectorStoreIndex
    from llama_index.core.llms import MockLLM
    from llama_index.core.schema import TextNode

    from llamaindex_pbr import PBRRetriever
    from llamaindex_pbr.testing import HashEmbedding

    emb = HashEmbedding(dim=DIM)
    storage = StorageContext.from_defaults(vector_store=llamaindex_store(target, collection))
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
    build = langchain_worker if adapter.startswith("langchain") else llamaindex_worker
    add, delete, query = build(target, collection)

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
