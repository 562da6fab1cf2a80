"""The check both adapters' PostgreSQL tests run on pbr's own write of their framework's rows
(``pbr_core.postgres.PgRecords.upsert`` with ``rows``): it stores exactly what the framework's
write stores, and replaces rows of the same key as it does.

``tests/`` is on ``sys.path`` (see ``doubles.py``): ``from pg_writes import ...``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy import text

from pbr_core.corpus import Record
from pbr_core.postgres import PgRecords


def batch(user: str, version: int, dim: int, rng: np.random.Generator) -> list[Record]:
    """Twelve records of ``user`` (keys ``key-0`` ...), text and metadata marked by ``version``:
    quotes, non-ASCII text, nested metadata on every other one, random float32 vectors."""
    return [
        Record(
            key=f"key-{i}",
            user_id=user,
            item_id=f"i{i}",
            text=f"note {i} v{version}: 'quotes', \"double\", ünïcode ✓",
            metadata={"user_id": user, "pbr_id": f"i{i}", "n": i * version}
            | ({"nested": {"a": [1, 2.5, None, True]}} if i % 2 else {}),
            vector=rng.standard_normal(dim).astype(np.float32),
        )
        for i in range(12)
    ]


def check_written_alike(
    pg: PgRecords, engine: Any, select: str, user: str, dim: int
) -> list[tuple[Any, ...]]:
    """Write a batch through the framework (``pg._write``) and, on an emptied table, through pbr
    (``pg.upsert``): ``select`` (the columns, in a stable order) reads the same rows; write the
    same keys again both ways: the same rows again, and pbr's revision trigger stamped the
    owner's write. Returns the rows after the second write."""
    assert pg.bulk_plan() is not None  # pbr writes them itself

    def rows() -> list[tuple[Any, ...]]:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(select))]

    def clear() -> None:
        with engine.begin() as conn:
            conn.execute(text(f"DELETE FROM {pg.table.qualified}"))

    rng = np.random.default_rng(5)
    v1, v2 = batch(user, 1, dim, rng), batch(user, 2, dim, rng)
    pg._write(v1)  # the framework's own write
    by_framework = rows()
    clear()
    pg.upsert(v1)  # pbr's statement
    assert rows() == by_framework and len(by_framework) == len(v1)
    token = pg.change_token(user)
    pg.upsert(v2)  # the same keys again: replaced
    by_pbr = rows()
    assert pg.change_token(user) not in (None, token)
    clear()
    pg._write(v1)
    pg._write(v2)
    assert rows() == by_pbr and len(by_pbr) == len(v2)
    return by_pbr
