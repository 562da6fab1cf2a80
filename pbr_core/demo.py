"""``pbr demo``: two users ask the same questions; dense, lexical, hybrid and personalized.

Each question is answered four ways from the asking user's own notes: dense (cosine with the
plain query), lexical (BM25), hybrid (both, fused: pbr's default search) and hybrid + PBR (the
query personalized first). Generic questions ("what should I make for dinner?") show what
personalization adds; specific ones ("which sauce did I buy at the market?") show what the
lexical leg adds.

Runs on the embedded defaults (all-MiniLM-L6-v2 and Gemma 3 270M, both shipped as PyPI
packages), fully offline. Generations are cached on disk, so a second run takes seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
from dataclasses import dataclass
from importlib import resources
from typing import Any, TextIO

from tqdm import tqdm

from .cache import GenerationCache
from .config import FusionMode, PBRConfig
from .pipeline import PRE_GATE_REASON, Personalizer, SearchResult
from .protocols import SearchHit, TextGenerator


@dataclass(frozen=True)
class SampleCorpus:
    users: dict[str, list[str]]
    questions: list[str]


def load_sample_corpus() -> SampleCorpus:
    """The two invented users (a health-focused cook, an adventurous eater) shipped with pbr."""
    raw = json.loads(
        resources.files("pbr_core").joinpath("data/sample_corpus.json").read_text("utf-8")
    )
    return SampleCorpus(users=raw["users"], questions=raw["questions"])


def build_personalizer(
    generator: TextGenerator | None = None, *, config: PBRConfig | None = None, **kwargs: Any
) -> Personalizer:
    """A personalizer holding the sample users (embedded defaults unless given)."""
    corpus = load_sample_corpus()
    p = Personalizer(generator=generator, config=config, **kwargs)
    for user, texts in corpus.users.items():
        p.add_texts(user, texts, ids=[f"{user}-{i:02d}" for i in range(len(texts))])
    return p


def _cell(hits: list[SearchHit], width: int) -> list[str]:
    lines: list[str] = []
    for rank, hit in enumerate(hits, 1):
        wrapped = textwrap.wrap(hit.text, width - 3) or [""]
        lines.append(f"{rank}. {wrapped[0]}")
        lines.extend(f"   {w}" for w in wrapped[1:2])
    return lines


COLUMNS = ("dense", "lexical (BM25)", "hybrid", "hybrid + PBR")


def render(user: str, question: str, columns: list[list[SearchHit]], res: SearchResult) -> str:
    """One user's top results, one column per search (:data:`COLUMNS`), then the explanation
    of the personalized one (``res``, the last column)."""
    width = max(100, min(shutil.get_terminal_size((140, 20)).columns, 180))
    col = (width - 3 * (len(columns) - 1)) // len(columns)
    cells = [_cell(hits, col) for hits in columns]
    out = [f"── {user}: {question} " + "─" * max(0, width - len(user) - len(question) - 6)]
    out.append(" │ ".join(f"{name:<{col}}" for name in COLUMNS[: len(columns)]).rstrip())
    for i in range(max(len(c) for c in cells)):
        row = [(c[i] if i < len(c) else "")[:col] for c in cells]
        out.append(" │ ".join(f"{x:<{col}}" for x in row).rstrip())
    e = res.personalized.explanation
    w = " ".join(
        f"{name}={value:.2f}" for name, value in (("w1", e.w1), ("w2", e.w2)) if value is not None
    )
    out.append(f"  PBR terms: {' + '.join(e.used)}   {w}")
    for utter in e.pseudo_utterances[:2]:
        out.append("  pseudo utterance: " + textwrap.shorten(utter, width - 22))
    if e.reasoning:
        out.append("  reasoning: " + textwrap.shorten(e.reasoning, width - 14))
    reasons: dict[str, list[str]] = {}
    for term, why in e.dropped.items():  # one line per reason, its terms named together
        reasons.setdefault(why, []).append(term)
    for why, terms in reasons.items():  # wrapped, not cut: the reason is the point
        out.extend(
            textwrap.wrap(
                f"dropped {', '.join(terms)}: {why}",
                width - 2,
                initial_indent="  ",
                subsequent_indent="    ",
            )
        )
    llm_ms = e.timings_ms.get("llm", 0.0)
    out.append(f"  time: {e.timings_ms.get('total', 0.0) / 1000:.1f} s (LLM {llm_ms / 1000:.1f} s)")
    return "\n".join(out)


def run_demo(
    *,
    k: int = 3,
    questions: int | None = None,
    generator: TextGenerator | None = None,
    cache_path: str | None = None,
    fusion: FusionMode | None = None,
    stream: TextIO = sys.stdout,
) -> list[dict[str, Any]]:
    """Run the demo and print it; returns the rows (for tests and notebooks).

    ``fusion`` overrides the default (``"safe"``); ``"paper"`` shows the paper's full shift.
    """
    from .models import cache_dir

    corpus = load_sample_corpus()
    path = cache_path or os.path.join(cache_dir(), "generations.jsonl")
    config = PBRConfig() if fusion is None else PBRConfig(fusion=fusion)
    p = build_personalizer(generator, config=config, cache=GenerationCache(path))
    if questions is not None and (isinstance(questions, bool) or questions < 1):
        raise ValueError(f"questions must be >= 1 (or None: all of them), got {questions!r}")
    asked = corpus.questions[: len(corpus.questions) if questions is None else questions]
    rows: list[dict[str, Any]] = []
    jobs = [(q, user) for q in asked for user in corpus.users]
    plain = p.config.with_(fusion="plain")
    with tqdm(jobs, desc="pbr demo: personalizing", unit="query", file=sys.stderr) as bar:
        for question, user in bar:
            dense = p.search(user, question, k, config=plain.with_(search="dense")).hits
            lexical = p.search(user, question, k, config=plain.with_(search="lexical")).hits
            hybrid = p.search(user, question, k, config=plain).hits
            res = p.search(user, question, k)
            rows.append(
                {
                    "user": user,
                    "question": question,
                    "dense": [h.id for h in dense],
                    "lexical": [h.id for h in lexical],
                    "plain": [h.id for h in hybrid],
                    "personalized": [h.id for h in res.hits],
                    "explanation": res.personalized.explanation.to_dict(),
                }
            )
            bar.clear()
            print(render(user, question, [dense, lexical, hybrid, res.hits], res), file=stream)
            print(file=stream, flush=True)
    print(summary(rows, k, p.config.fusion), file=stream)
    return rows


def summary(rows: list[dict[str, Any]], k: int, fusion: FusionMode) -> str:
    """The demo's last words: how many rankings changed, and why the others did not."""
    changed = sum(r["plain"] != r["personalized"] for r in rows)
    gated = sum(
        any(why.startswith(PRE_GATE_REASON) for why in r["explanation"]["dropped"].values())
        for r in rows
    )
    kept = sum(r["explanation"]["trust"].get("shift") == 0.0 for r in rows) - gated
    lines = [
        f"{changed} of {len(rows)} top-{k} rankings changed once personalized ({fusion} fusion)."
    ]
    if rows and "dense" in rows[0]:
        hybrid = sum(r["plain"] != r["dense"] for r in rows)
        lexical = sum(r["lexical"] != r["dense"] for r in rows)
        lines.append(
            f"Hybrid search changed the dense top-{k} for {hybrid} of {len(rows)} (BM25 alone: "
            f"{lexical}); `PBRConfig(search=...)` picks hybrid (default), dense or lexical."
        )
    if gated:
        lines.append(
            f"For {gated} of {len(rows)} the user's history already matched the question, so safe "
            "fusion kept the plain query without calling the LLM (the pre-generation gate)."
        )
    if kept:
        lines.append(
            f"For {kept} of {len(rows)} safe fusion asked the LLM and kept the plain query, "
            "judging its pseudo feedback not worth the move."
        )
    if gated or kept:
        lines.append(
            "Each reason is under 'dropped' above; `pbr demo --fusion paper` applies the "
            "paper's full shift regardless."
        )
    lines.append(
        "The embedded Gemma 3 270M is a tiny model; bring your own LLM for stronger feedback."
    )
    return "\n".join(lines)
