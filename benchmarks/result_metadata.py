"""How big a LangChain result's metadata is per ``PBRConfig.explain`` mode, and whether
``MultiQueryRetriever`` merges one item found by several queries (issue #39, points 1 and 2).

Two corpora of 10 items per user, as in the issue: ~900-character chunks and short notes
(~40 characters). A ``PBRRetriever`` over ``InMemoryVectorStore`` (deterministic fake
embeddings, 64-d) with a scripted chat model that answers like a real one (10 pseudo utterances
of ~12 words, a 3-sentence reasoning), ``fusion="paper"`` so that every term and its text enter
the explanation. Per mode and corpus at k = 10: the bytes of the documents' metadata as JSON,
the bytes of the request's custom events (``pbr.*``, what a callback handler or a trace gets,
whatever the mode), and, through LangChain's ``MultiQueryRetriever`` with three generated
queries, how many documents come back and how many distinct items they are.

Sizes are exact (no timing): one run, fixed seed, no data set.

    python benchmarks/result_metadata.py          # seconds

Prints a table and writes ``benchmarks/results/result_metadata.{csv,json,png}``.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import random
from pathlib import Path
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.language_models import GenericFakeChatModel
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage
from langchain_core.vectorstores import InMemoryVectorStore

from langchain_pbr import PBRRetriever
from pbr_bench.paths import RESULTS_DIR
from pbr_core import PBRConfig
from pbr_core.config import EXPLAIN_MODES

WORDS = [
    "dog",
    "walk",
    "river",
    "morning",
    "coffee",
    "run",
    "marathon",
    "training",
    "vegan",
    "lunch",
    "book",
    "club",
    "curry",
    "sister",
    "allergy",
    "peanuts",
    "garden",
    "tomatoes",
    "bike",
    "commute",
    "rain",
    "jacket",
    "guitar",
    "lesson",
    "jazz",
    "record",
    "shop",
]
K = 10


class Events(BaseCallbackHandler):
    """The bytes of every custom event a request emits."""

    def __init__(self) -> None:
        self.bytes = 0

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        self.bytes += len(json.dumps({"name": name, "data": data}, default=str))


def text(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    while sum(len(w) + 1 for w in out) < chars:
        out.append(rng.choice(WORDS))
    return " ".join(out)


def answer(rng: random.Random) -> str:
    """A chat model's answer to both P-PRF prompts (pbr parses each call's part)."""
    utterances = [text(rng, 70) for _ in range(10)]
    return json.dumps({"candidates": utterances, "reasoning": text(rng, 300)})


def measure(corpus: str, chars: int, explain: str, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    emb = DeterministicFakeEmbedding(size=64)
    llm = FakeListChatModel(responses=[answer(rng)])
    config = PBRConfig(fusion="paper", explain=explain)  # type: ignore[arg-type]
    r = PBRRetriever(llm=llm, embeddings=emb, vectorstore=InMemoryVectorStore(emb), config=config)
    docs = [Document(page_content=text(rng, chars)) for _ in range(10)]
    r.add_documents(docs, user_id="u", ids=[f"n{i}" for i in range(10)])
    events = Events()
    got = r.invoke("what did I do with the dog?", user_id="u", k=K, config={"callbacks": [events]})
    from langchain_classic.retrievers import MultiQueryRetriever

    queries = GenericFakeChatModel(messages=iter([AIMessage("dog walk\nriver run\ncoffee")]))
    multi = MultiQueryRetriever.from_llm(retriever=r.model_copy(update={"k": 4}), llm=queries)
    merged = multi.invoke("the dog?", config={"metadata": {"user_id": "u"}})
    return {
        "corpus": corpus,
        "item_chars": round(sum(len(d.page_content) for d in got) / len(got)),
        "explain": explain,
        "metadata_bytes": len(json.dumps([d.metadata for d in got], default=str)),
        "content_bytes": sum(len(d.page_content) for d in got),
        "event_bytes": events.bytes,
        "multi_query_docs": len(merged),
        "multi_query_distinct": len({d.id for d in merged}),
    }


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    corpora = list(dict.fromkeys(r["corpus"] for r in rows))
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(EXPLAIN_MODES)
    for i, mode in enumerate(EXPLAIN_MODES):
        vals = [
            next(r["metadata_bytes"] for r in rows if (r["corpus"], r["explain"]) == (c, mode))
            for c in corpora
        ]
        ax.bar([j + i * width for j in range(len(corpora))], vals, width, label=f"explain={mode}")
    ax.set_xticks([j + 1.5 * width for j in range(len(corpora))], corpora)
    ax.set_yscale("log")
    ax.set_ylabel(f"bytes of metadata, {K} documents (log)")
    ax.set_title("LangChain result metadata per explain mode")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    rows = [
        measure(corpus, chars, mode, args.seed)
        for corpus, chars in (("chunks ~900 chars", 900), ("notes ~40 chars", 40))
        for mode in EXPLAIN_MODES
    ]
    header = f"{'corpus':<18} {'explain':<7} {'metadata B':>10} {'events B':>9} {'MultiQuery':>12}"
    print(header)
    for r in rows:
        mq = f"{r['multi_query_docs']} / {r['multi_query_distinct']}"
        print(
            f"{r['corpus']:<18} {r['explain']:<7} {r['metadata_bytes']:>10} "
            f"{r['event_bytes']:>9} {mq:>12}"
        )
    print("MultiQuery: documents returned / distinct items (3 queries, k=4 each)")
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"seed": args.seed, "k": K, "python": platform.python_version()}
    (args.out / "result_metadata.json").write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n"
    )
    with (args.out / "result_metadata.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, args.out / "result_metadata.png")
    print(f"wrote {args.out / 'result_metadata'}.{{json,csv,png}}")


if __name__ == "__main__":
    main()
