"""PBR with a Chroma server as the host vector store, through LangChain and through LlamaIndex.

Every user's memories live in one Chroma collection per framework; PBR personalizes each query
vector for the requesting user, and Chroma searches with a per-user ``where`` filter in the
database. Runs as is, offline, in a few seconds:

    pip install 'personalize-before-retrieve[langchain,llamaindex,chroma]'
    python examples/chroma_example.py                       # starts a throwaway chroma server
    python examples/chroma_example.py --port 8000           # or use yours:
    #   ANONYMIZED_TELEMETRY=False chroma run --path ./chroma-data --host 127.0.0.1 --port 8000

The embedding is a bag-of-words stand-in and the LLMs are fakes that echo their prompt, so the
example needs no model; swap in yours where the comments say so.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import chromadb
from chromadb.config import Settings
from langchain_chroma import Chroma
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import ParrotFakeChatModel
from llama_index.core import VectorStoreIndex
from llama_index.core.llms.mock import MockLLM
from llama_index.core.schema import TextNode
from llama_index.vector_stores.chroma import ChromaVectorStore

from langchain_pbr import PBRRetriever as LangChainPBR
from llamaindex_pbr import PBRRetriever as LlamaIndexPBR
from llamaindex_pbr.testing import HashEmbedding
from pbr_core import PBRConfig, VectorStoreUnavailableError

MEMORIES = {
    "alice": [
        "I run 10k every Sunday morning along the river.",
        "Pasta the night before a long run works best for me.",
        "My sister Ana visits in May; she is allergic to peanuts.",
        "Training for the Paris marathon in April.",
    ],
    "bob": [
        "I shoot black and white film on a Leica M6.",
        "Looking for a cheap steakhouse for my brother's birthday.",
        "Watching the Monaco Grand Prix at my uncle's place.",
    ],
}
QUERY = "what should I eat before Sunday?"


class BagOfWords(Embeddings):
    """A LangChain face on ``HashEmbedding``: texts sharing words get close vectors.

    Use your real embeddings instead (``OpenAIEmbeddings()``, ``HuggingFaceEmbeddings()``, or
    ``pbr_core.models.MiniLMEmbedder()`` offline); the store and PBR must share the model.
    """

    def __init__(self, dim: int = 64) -> None:
        self.model = HashEmbedding(dim=dim)
        self.model_name = self.model.model_name  # PBR records it, and checks it on load

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self.model.embed(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self.model.embed(text)


def start_server(folder: str) -> tuple[subprocess.Popen[bytes], int]:
    """A throwaway ``chroma run`` on a free loopback port; returns the process and the port."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    chroma = Path(sys.executable).with_name("chroma")
    proc = subprocess.Popen(
        [str(chroma), "run", "--path", folder, "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "ANONYMIZED_TELEMETRY": "False"},
    )
    for _ in range(300):  # ~1 s on an idle machine
        if proc.poll() is not None:  # `chroma run` exits 0 when the port is taken
            raise RuntimeError(f"chroma run exited with {proc.returncode}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/heartbeat", timeout=1)
            return proc, port
        except OSError:
            time.sleep(0.1)
    proc.terminate()
    raise RuntimeError("chroma run did not answer its heartbeat in 30 s")


def show(title: str, rows: list[tuple[str, str, float | None]], explanation: dict) -> None:
    print(f"\n{title}")
    for owner, text, score in rows:
        print(f"  [{owner}] {text}   (score {score:.3f})" if score is not None else f"  {text}")
    print(f"  q* built from {explanation['used']}, w1={explanation['w1']}, w2={explanation['w2']}")
    print(f"  anchor items: {[a['text'][:40] for a in explanation['anchor_items']]}")
    print(f"  timings (ms): {explanation['timings_ms']}")


def langchain_part(client: chromadb.ClientAPI, workdir: Path) -> LangChainPBR:
    embeddings = BagOfWords()
    store = Chroma(
        client=client,
        collection_name="pbr_langchain",
        embedding_function=embeddings,
        # cosine: Chroma ranks like PBR's unit vectors (its own score is a cosine distance)
        collection_configuration={"hnsw": {"space": "cosine"}},
    )
    retriever = LangChainPBR(
        llm=ParrotFakeChatModel(),  # your chat model: ChatOpenAI(...), ChatOllama(...), ...
        embeddings=embeddings,
        vectorstore=store,
        k=2,
        # scores on every document, the explanation on the top one (by default documents are the
        # stored ones and both go to the callbacks' pbr.* events)
        config={"explain": "first"},
    )
    for user, texts in MEMORIES.items():
        retriever.add_documents([Document(page_content=t) for t in texts], user_id=user)

    docs = retriever.invoke(QUERY, user_id="alice")
    rows = [(d.metadata["user_id"], d.page_content, d.metadata["score"]) for d in docs]
    show("LangChain, alice (score = cosine with q*):", rows, docs[0].metadata["pbr"])

    # The restart path: Chroma is the truth (a fresh process reads each user from it); pbr's
    # saved state adds the computed anchors, checked against Chroma at each user's first read.
    retriever.save(workdir / "langchain_history")
    reloaded = LangChainPBR.load(
        workdir / "langchain_history", llm=ParrotFakeChatModel(), vectorstore=store, k=2
    )
    docs = reloaded.invoke(QUERY, user_id="bob")
    print("  after save/load, bob gets:", [d.page_content for d in docs])
    return reloaded


def llamaindex_part(client: chromadb.ClientAPI, workdir: Path) -> None:
    embed_model = HashEmbedding(dim=64)  # your BaseEmbedding
    collection = client.get_or_create_collection(
        "pbr_llamaindex",
        embedding_function=None,  # always: else Chroma tries to download its default model
        configuration={"hnsw": {"space": "cosine"}},
    )
    index = VectorStoreIndex.from_vector_store(
        ChromaVectorStore(chroma_collection=collection), embed_model=embed_model
    )
    base = LlamaIndexPBR(
        index,
        llm=MockLLM(),
        embed_model=embed_model,
        similarity_top_k=2,
        config=PBRConfig(explain="first"),  # the explanation on the top node (default: events)
    )
    for user, texts in MEMORIES.items():
        base.for_user(user).add_nodes([TextNode(text=t) for t in texts])

    alice = base.for_user("alice")
    nodes = alice.retrieve(QUERY)
    rows = [(n.node.metadata["user_id"], n.node.get_content(), n.score) for n in nodes]
    show("LlamaIndex, alice (score = cosine with q*):", rows, nodes[0].node.metadata["pbr"])

    alice.persist(workdir / "llamaindex")
    again = LlamaIndexPBR.from_persist_dir(
        workdir / "llamaindex",
        llm=MockLLM(),
        embed_model=embed_model,
        vector_store_loader=lambda _folder: ChromaVectorStore(chroma_collection=collection),
    )
    print(
        "  after persist/load, alice gets:", [n.node.get_content() for n in again.retrieve(QUERY)]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, help="your server's port (default: start a throwaway one)")
    ap.add_argument("--host", help="your server's host, with --port (default: 127.0.0.1)")
    args = ap.parse_args()
    if args.host is not None and args.port is None:  # the throwaway server listens locally only
        ap.error("--host names your server: give its --port too")
    args.host = args.host or "127.0.0.1"
    with tempfile.TemporaryDirectory(prefix="pbr-chroma-example-") as tmp:
        proc = None
        if args.port is None:
            proc, args.port = start_server(str(Path(tmp) / "db"))
        try:
            client = chromadb.HttpClient(
                host=args.host, port=args.port, settings=Settings(anonymized_telemetry=False)
            )
            retriever = langchain_part(client, Path(tmp))
            llamaindex_part(client, Path(tmp))
            if proc is not None:  # what an outage looks like: a clear error, no partial state
                proc.terminate()
                proc.wait(30)
                try:
                    retriever.add_documents([Document(page_content="lost")], user_id="alice")
                except VectorStoreUnavailableError as exc:
                    print(f"\nserver stopped -> {type(exc).__name__}: {exc}")
                    print("  alice's history still has", len(retriever.history.get("alice")))
        finally:
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(30)


if __name__ == "__main__":
    main()
