"""The "Over PostgreSQL" code of docs/langchain.md and docs/llamaindex.md runs as written, against
a real PostgreSQL + pgvector: only the server's port and database name are swapped in."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _block(page: str, heading: str) -> str:
    text = (DOCS / page).read_text(encoding="utf-8")
    found = re.search(r"```python\n(.*?)```", text[text.index(heading) :], re.S)
    assert found, f"no python block after {heading!r} in {page}"
    return found.group(1)


@pytest.mark.parametrize(
    ("page", "heading"),
    [("langchain.md", "**Over PostgreSQL.**"), ("llamaindex.md", "## Over PostgreSQL")],
)
def test_the_postgres_section_runs_as_written(
    page: str, heading: str, pgvector_engine: Any
) -> None:
    url = pgvector_engine[0].url
    code = _block(page, heading)
    swaps = {
        "127.0.0.1:5432/postgres": f"127.0.0.1:{url.port}/{url.database}",
        'port="5432"': f'port="{url.port}"',
        'database="postgres"': f'database="{url.database}"',
    }
    hits = 0
    for old, new in swaps.items():
        hits += code.count(old)
        code = code.replace(old, new)
    assert hits >= 1, "the block names no server this test can swap"
    exec(compile(code, str(DOCS / page), "exec"), {})  # its own asserts are the check
