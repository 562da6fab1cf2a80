"""pbr_core.postgres on a real PostgreSQL + pgvector: the owner index, the change token kept by
the trigger whoever writes, verification that skips the listing only while nothing changed, and
the fallback for a role that may not create the trigger.

A plain table (``id``, ``doc``, ``meta`` JSONB, ``emb`` vector) stands for a framework's; the
adapters' own tables are run by the ownership contract suite.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

import pbr_core.corpus
import pbr_core.snapshot
from pbr_core import HistoryItem, PBRConfig, Personalizer, postgres
from pbr_core.corpus import Corpus, Record
from pbr_core.errors import EmbeddingError
from pbr_core.fusion import FusionInputs, FusionResult, default_rule
from pbr_core.lexical import LexicalIndex
from pbr_core.postgres import PgRecords, PgTable, engine_sql, record_rows
from pbr_core.retrieval import Request, retrieve
from pbr_core.view import ScoredView
from pbr_core.windows import Window

DIM = 16  # the hash_embedder fixture's


def _table(engine: Any, name: str = "notes") -> tuple[PgTable, Any]:
    sql = engine_sql(engine)
    sql(
        [
            (
                f"CREATE TABLE {name} (id text PRIMARY KEY, doc text, meta jsonb, "
                f"emb vector({DIM}))",
                {},
            )
        ]
    )
    return PgTable("public", name, "id", "doc", "meta", "emb"), sql


def _writer(table: PgTable, sql: Any) -> Any:
    def write(records: Sequence[Record]) -> None:
        sql(
            [
                (
                    f"INSERT INTO {table.qualified} VALUES (:id, :doc, CAST(:meta AS jsonb), "
                    "CAST(:emb AS vector)) ON CONFLICT (id) DO UPDATE SET doc = EXCLUDED.doc, "
                    "meta = EXCLUDED.meta, emb = EXCLUDED.emb",
                    {
                        "id": r.key,
                        "doc": r.text,
                        "meta": json.dumps(dict(r.metadata)),
                        "emb": json.dumps([float(x) for x in np.asarray(r.vector)]),
                    },
                )
                for r in records
            ]
        )

    return write


def _records(engine: Any, name: str = "notes") -> PgRecords:
    table, sql = _table(engine, name)
    return PgRecords(table, sql, "user_id", _writer(table, sql))


def _corpus(host: PgRecords, embedder: Any) -> tuple[Corpus, list[str]]:
    """A corpus over ``host`` whose ``list_user`` calls are counted (user ids appended)."""
    listed: list[str] = []
    real = host.list_user

    def counting(user_id: str) -> list[Record]:
        listed.append(user_id)
        return real(user_id)

    host.list_user = counting  # type: ignore[method-assign]
    return Corpus(host, embedder=embedder), listed


def _add(corpus: Corpus, user: str, texts: dict[str, str]) -> None:
    corpus.add(user, [HistoryItem(id=i, text=t) for i, t in texts.items()])


@contextlib.contextmanager
def _login_as(engine: Any, role: str, *grants: str) -> Iterator[Any]:
    """An engine of a new login role granted ``grants`` (e.g. ``"SELECT ON notes"``); the role
    and what it owns are dropped afterwards."""
    from sqlalchemy import create_engine

    sql = engine_sql(engine)
    sql(
        [
            (f"DROP ROLE IF EXISTS {role}", {}),
            (f"CREATE ROLE {role} LOGIN", {}),
            *((f"GRANT {grant} TO {role}", {}) for grant in grants),
        ]
    )
    app = create_engine(engine.url.set(username=role))
    try:
        yield app
    finally:
        app.dispose()
        sql([(f"DROP OWNED BY {role}", {}), (f"DROP ROLE {role}", {})])


def _ids(corpus: Corpus, user: str) -> list[str]:
    history = corpus.history(user)
    return [] if history is None else sorted(item.id for item in history.items)


def _revision_of(token: str | None) -> str | None:
    """The owner's revision in a change token (``rev@triggers``)."""
    return None if token is None else token.split("@", 1)[0]


def test_the_change_token_moves_on_every_write_whoever_makes_it(pgvector_engine: Any) -> None:
    host = _records(pgvector_engine[0])
    sql = host.sql
    assert host.tokens and _revision_of(host.change_token("alice")) == "none"
    seen = [host.change_token("alice")]
    vec = json.dumps([1.0] + [0.0] * (DIM - 1))
    writes = [
        "INSERT INTO notes VALUES ('a', 'x', '{\"user_id\": \"alice\"}', :v)",
        "UPDATE notes SET doc = 'y' WHERE id = 'a'",
        "INSERT INTO notes VALUES ('b', 'z', '{\"user_id\": \"alice\"}', :v)",
        "DELETE FROM notes WHERE id = 'a'",
        "TRUNCATE notes",
    ]
    for statement in writes:
        sql([(statement, {"v": vec})])
        seen.append(host.change_token("alice"))
    assert len(set(seen)) == len(seen), seen  # every write gave a new token, none came back
    before = host.change_token("alice")
    sql([("INSERT INTO notes VALUES ('c', 'bob', '{\"user_id\": \"bob\"}', :v)", {"v": vec})])
    assert host.change_token("alice") == before  # another user's write leaves alice's alone
    assert _revision_of(host.change_token("bob")) not in (None, "none")


@pytest.mark.parametrize(
    "enable",
    ["ENABLE TRIGGER USER", "ENABLE ALWAYS TRIGGER {rev}, ENABLE ALWAYS TRIGGER {trunc}"],
)
def test_a_write_made_while_the_trigger_was_off_is_seen_once_it_is_on_again(
    pgvector_engine: Any, hash_embedder: Any, enable: str
) -> None:
    """``pg_restore --disable-triggers`` and bulk loads turn the triggers off and on around
    their writes: the revision does not move, but the triggers' catalog rows do, and the token
    with them (turned on the plain way, they give no token at all: every read lists)."""
    corpus, _ = _corpus(_records(pgvector_engine[0]), hash_embedder)
    _add(corpus, "alice", {"x": "alice one", "y": "alice two"})
    assert _ids(corpus, "alice") == ["x", "y"]
    names = corpus.host._trigger_names()  # type: ignore[union-attr]
    corpus.host.sql(  # type: ignore[union-attr]
        [
            ("ALTER TABLE notes DISABLE TRIGGER USER", {}),
            ("DELETE FROM notes WHERE meta ->> 'pbr_id' = 'x'", {}),
            ("ALTER TABLE notes " + enable.format(**names), {}),
        ]
    )
    assert _ids(corpus, "alice") == ["y"]
    armed = corpus.host.change_token("alice") is not None  # type: ignore[union-attr]
    assert armed == ("ALWAYS" in enable)


def test_a_partitioned_tables_writes_move_its_revision(
    pgvector_engine: Any, hash_embedder: Any
) -> None:
    """Row triggers on a partitioned table run on its partitions; the revision they stamp is
    the partitioned table's, the one pbr reads."""
    sql = engine_sql(pgvector_engine[0])
    sql(
        [
            (
                f"CREATE TABLE notes (id text PRIMARY KEY, doc text, meta jsonb, "
                f"emb vector({DIM})) PARTITION BY HASH (id)",
                {},
            ),
            (
                "CREATE TABLE notes_0 PARTITION OF notes FOR VALUES WITH (MODULUS 2, REMAINDER 0)",
                {},
            ),
            (
                "CREATE TABLE notes_1 PARTITION OF notes FOR VALUES WITH (MODULUS 2, REMAINDER 1)",
                {},
            ),
        ]
    )
    table = PgTable("public", "notes", "id", "doc", "meta", "emb")
    corpus, _ = _corpus(PgRecords(table, sql, "user_id", _writer(table, sql)), hash_embedder)
    _add(corpus, "alice", {"x": "alice one", "y": "alice two", "z": "alice three"})
    assert corpus.host.change_token("alice") is not None  # type: ignore[union-attr]
    assert _ids(corpus, "alice") == ["x", "y", "z"]
    sql([("DELETE FROM notes WHERE meta ->> 'pbr_id' IN ('x', 'y')", {})])
    assert _ids(corpus, "alice") == ["z"]


def test_a_replication_sessions_write_moves_the_revision(pgvector_engine: Any) -> None:
    """A logical replication apply worker writes with ``session_replication_role = replica``,
    which skips ordinary triggers; pbr's fire ALWAYS."""
    host = _records(pgvector_engine[0])
    before = host.change_token("alice")
    vec = json.dumps([1.0] + [0.0] * (DIM - 1))
    host.sql(
        [
            ("SET LOCAL session_replication_role = replica", {}),
            ("INSERT INTO notes VALUES ('a', 'x', '{\"user_id\": \"alice\"}', :v)", {"v": vec}),
        ]
    )
    assert host.change_token("alice") not in (None, before)


def test_triggers_that_fire_only_for_ordinary_sessions_are_not_trusted_until_set_up_again(
    pgvector_engine: Any,
) -> None:
    """An install from before ``ENABLE ALWAYS`` (or one a DBA re-enabled the plain way) gives
    no token, so reads list; the next setup by a role that may arms the triggers again."""
    host = _records(pgvector_engine[0])
    names = host._trigger_names()
    host.sql([(f"ALTER TABLE notes ENABLE TRIGGER {name}", {}) for name in names.values()])
    assert host.change_token("alice") is None
    again = PgRecords(host.table, host.sql, "user_id", _writer(host.table, host.sql))
    assert again.change_token("alice") is not None and host.change_token("alice") is not None


def test_an_unchanged_user_is_verified_without_listing_and_a_change_is_seen(
    pgvector_engine: Any, hash_embedder: Any
) -> None:
    corpus, listed = _corpus(_records(pgvector_engine[0]), hash_embedder)
    _add(corpus, "alice", {"x": "alice pin is 4321", "y": "alice likes tea"})
    assert corpus.history("alice") is not None  # lists once: the token moved with the add
    listed.clear()
    for _ in range(3):
        history = corpus.history("alice")
        assert history is not None and len(history) == 2
    assert listed == []  # three checks, no listing
    # A delete made by plain SQL, not through pbr: the next read sees it.
    corpus.host.sql([("DELETE FROM notes WHERE meta ->> 'pbr_id' = 'x'", {})])  # type: ignore[union-attr]
    history = corpus.history("alice")
    assert listed == ["alice"]
    assert history is not None and [it.id for it in history.items] == ["y"]


def test_a_second_corpus_sees_the_first_ones_writes_through_the_token(
    pgvector_engine: Any, hash_embedder: Any
) -> None:
    engine = pgvector_engine[0]
    first, _ = _corpus(_records(engine), hash_embedder)
    table = PgTable("public", "notes", "id", "doc", "meta", "emb")
    sql = engine_sql(engine)
    second = Corpus(PgRecords(table, sql, "user_id", _writer(table, sql)), embedder=hash_embedder)
    _add(first, "alice", {"x": "alice one"})
    assert [it.id for it in second.history("alice").items] == ["x"]  # type: ignore[union-attr]
    _add(first, "alice", {"y": "alice two"})
    first.delete("alice", ["x"])
    assert [it.id for it in second.history("alice").items] == ["y"]  # type: ignore[union-attr]


def test_listing_a_user_runs_on_the_owner_index(pgvector_engine: Any) -> None:
    host = _records(pgvector_engine[0])
    vec = json.dumps([1.0] + [0.0] * (DIM - 1))
    host.sql(
        [
            (
                "INSERT INTO notes SELECT 'k' || i, 'text', jsonb_build_object('user_id', "
                "'u' || (i % 100)), CAST(:v AS vector) FROM generate_series(1, 5000) i",
                {"v": vec},
            ),
            ("ANALYZE notes", {}),
        ]
    )
    plan = host.sql(
        [("EXPLAIN SELECT id FROM notes WHERE (meta ->> 'user_id') = 'u7'", {"v": vec})]
    )
    assert "pbr_owner_" in "\n".join(str(r[0]) for r in plan)
    assert len(host.list_user("u7")) == 50


def test_a_table_made_under_a_renamed_tables_name_gets_its_own_owner_index(
    pgvector_engine: Any,
) -> None:
    """The renamed table keeps its index named pbr_owner_<suffix>: the new table gets one of
    its own, named with its oid (before, CREATE INDEX IF NOT EXISTS saw the other table's and
    created none: every listing a sequential scan)."""
    engine = pgvector_engine[0]
    _records(engine, "archived")
    sql = engine_sql(engine)
    sql([("ALTER TABLE archived RENAME TO archived_2025", {})])
    host = _records(engine, "archived")  # a new table under the old name
    indexes = host.sql(
        [
            (
                "SELECT c.relname, i.indrelid::regclass::text FROM pg_index i JOIN pg_class c "
                "ON c.oid = i.indexrelid WHERE c.relname LIKE 'pbr_owner_%' AND "
                "i.indrelid::regclass::text IN ('archived', 'archived_2025') ORDER BY 2",
                {},
            )
        ]
    )
    assert [table for _, table in indexes] == ["archived", "archived_2025"]
    assert indexes[0][0] != indexes[1][0]
    again = PgRecords(host.table, host.sql, "user_id", _writer(host.table, host.sql))
    assert again.change_token("u1") is not None  # set up, found current: nothing made again


@pytest.mark.parametrize(
    ("name", "user_key"),
    [
        ("notes %I x", "user_id"),
        ("a$pbr$b", "user_id"),
        ("a$pbr$b$pbr5$$pbr6$", "user_id"),  # a dollar tag chosen by length looped for good
        ("plain", "user%ID's"),
    ],
)
def test_names_holding_format_or_dollar_quote_marks_get_the_owner_index_and_trigger(
    pgvector_engine: Any, name: str, user_key: str
) -> None:
    """A table or user key holding ``%I``, ``%`` or the DO block's ``$pbr$`` is set up like any
    other (before, format() or the dollar quote broke setup: no token, no index, every read a
    sequential scan)."""
    sql = engine_sql(pgvector_engine[0])
    quoted = '"' + name.replace('"', '""') + '"'
    sql(
        [
            (
                f"CREATE TABLE {quoted} (id text PRIMARY KEY, doc text, meta jsonb, "
                f"emb vector({DIM}))",
                {},
            )
        ]
    )
    table = PgTable("public", name, "id", "doc", "meta", "emb")
    host = PgRecords(table, sql, user_key, _writer(table, sql))
    assert host.change_token("alice") is not None
    found = sql(
        [
            (
                "SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "WHERE i.indrelid = to_regclass(:tbl) AND c.relname LIKE 'pbr_owner_%'",
                {"tbl": table.regclass},
            )
        ]
    )
    assert found == [(1,)]


def test_a_worker_that_waited_for_anothers_install_stamps_no_owner_again(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers starting at once all find pbr not installed; the first installs under the
    lock, and the others, once they hold it, find it installed: they stamp no owner again
    (before, each re-stamped every owner after a scan of the whole table, invalidating every
    worker's cache and every shared state)."""
    host = _records(pgvector_engine[0])
    corpus, _ = _corpus(host, hash_embedder)
    _add(corpus, "alice", {"x": "alice one"})
    token = host.change_token("alice")
    monkeypatch.setattr(PgRecords, "_installed", lambda self: (False, False))  # read too early
    late = PgRecords(host.table, host.sql, "user_id", _writer(host.table, host.sql))
    assert _revision_of(late.change_token("alice")) == _revision_of(token)


@pytest.mark.parametrize("cold_first", [False, True])
def test_a_vector_changed_alone_is_seen_by_a_warm_worker(
    pgvector_engine: Any, hash_embedder: Any, cold_first: bool
) -> None:
    """A row whose vector alone changes (re-embedded by another process; same text and
    metadata) moves the token, and its row version (xmin) is part of the revision: the warm
    worker reads the new vector (before, the revision matched and it kept the old one)."""
    host = _records(pgvector_engine[0])
    writer, _ = _corpus(host, hash_embedder)
    _add(writer, "alice", {"x": "alice one", "y": "alice two"})
    reader = Corpus(host, embedder=hash_embedder) if cold_first else writer
    before = np.array(reader.history("alice").vectors)  # type: ignore[union-attr]
    other = np.zeros(DIM)
    other[3] = 1.0
    host.sql(
        [
            (
                "UPDATE notes SET emb = CAST(:v AS vector) WHERE id = :k",
                {"v": json.dumps(other.tolist()), "k": host.list_user("alice")[0].key},
            )
        ]
    )
    after = np.array(reader.history("alice").vectors)  # type: ignore[union-attr]
    assert not np.allclose(before, after)
    assert any(np.allclose(row, other, atol=1e-6) for row in after)


def test_a_role_that_may_not_create_the_trigger_still_verifies_by_listing(
    pgvector_engine: Any, hash_embedder: Any, caplog: pytest.LogCaptureFixture
) -> None:
    owner_engine = pgvector_engine[0]
    table, sql = _table(owner_engine)
    with _login_as(owner_engine, "pbr_app", "SELECT, INSERT, UPDATE, DELETE ON notes") as app:
        app_sql = engine_sql(app)
        with caplog.at_level(logging.WARNING, logger="pbr.postgres"):
            host = PgRecords(table, app_sql, "user_id", _writer(table, app_sql))
        assert not host.tokens and "every query lists" in caplog.text
        assert host.change_token("alice") is None
        corpus, listed = _corpus(host, hash_embedder)
        _add(corpus, "alice", {"x": "alice one", "y": "alice two"})
        sql([("DELETE FROM notes WHERE meta ->> 'pbr_id' = 'x'", {})])
        assert [it.id for it in corpus.history("alice").items] == ["y"]  # type: ignore[union-attr]
        assert listed == ["alice"]


def test_a_nul_character_is_refused_before_anything_is_written(
    pgvector_engine: Any, hash_embedder: Any
) -> None:
    corpus, _ = _corpus(_records(pgvector_engine[0]), hash_embedder)
    with pytest.raises(ValueError, match="NUL"):
        corpus.add_many(
            {
                "alice": [HistoryItem(id="a", text="fine")],
                "bob": [HistoryItem(id="b", text="bad\x00text")],
            }
        )
    count = corpus.host.sql([("SELECT count(*) FROM notes", {})])  # type: ignore[union-attr]
    assert count == [(0,)]
    with pytest.raises(ValueError, match="NUL"):  # a NUL in a metadata key, deep down
        corpus.add("alice", [HistoryItem(id="a", text="fine", metadata={"n": [{"k\x00": 1}]})])
    # the six characters \u0000 are no NUL (code, a regex): stored as they are (refused before)
    corpus.add("alice", [HistoryItem(id="c", text="fine", metadata={"regex": "\\u0000"})])
    assert _ids(corpus, "alice") == ["c"]


def test_a_disabled_trigger_makes_every_read_list_again(
    pgvector_engine: Any, hash_embedder: Any
) -> None:
    """Writes made while the trigger is off do not move the revision: pbr must notice the
    trigger is off (in the same read) and list, not trust an unmoved token."""
    corpus, listed = _corpus(_records(pgvector_engine[0]), hash_embedder)
    _add(corpus, "alice", {"x": "alice one", "y": "alice two"})
    corpus.history("alice")
    sql = corpus.host.sql  # type: ignore[union-attr]
    sql([("ALTER TABLE notes DISABLE TRIGGER USER", {})])
    sql([("DELETE FROM notes WHERE meta ->> 'pbr_id' = 'x'", {})])
    listed.clear()
    assert [it.id for it in corpus.history("alice").items] == ["y"]  # type: ignore[union-attr]
    assert listed == ["alice"]


def test_vectors_are_read_back_exactly_in_binary_from_a_vector_column(
    pgvector_engine: Any,
) -> None:
    host = _records(pgvector_engine[0])
    vectors = np.random.default_rng(0).normal(size=(3, DIM)).astype(np.float32)
    host.upsert(
        [
            Record(
                key=f"k{i}",
                user_id="u",
                item_id=f"i{i}",
                text="t",
                vector=v,
                metadata={"user_id": "u", "pbr_id": f"i{i}"},
            )
            for i, v in enumerate(vectors)
        ]
    )
    got = {r.key: r.vector for r in host.fetch("u", ["k0", "k1", "k2"])}
    assert host._vector_select().endswith('.vector_send("emb")')
    for i, v in enumerate(vectors):
        read = got[f"k{i}"]
        assert read is not None
        assert read.dtype == np.float32
        assert np.array_equal(read, v)


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_a_query_vector_reaches_pgvector_as_its_nearest_float32s_whatever_the_driver(
    pgvector_engine: Any, driver: str
) -> None:
    """The query vector of a scored read (:class:`QueryVector`): in pgvector's binary form
    through psycopg 3, as text through another driver, through pbr's driver path and through
    SQLAlchemy's; each way the database holds the float32 nearest to each value."""
    from sqlalchemy import create_engine

    engine = create_engine(pgvector_engine[0].url.set(drivername=f"postgresql+{driver}"))
    try:
        sql = engine_sql(engine)
        values = np.random.default_rng(3).standard_normal(DIM) / 7.0
        statement = "SELECT vector_dims(CAST(:q AS vector)), CAST(:q AS vector)::text"
        params = {"q": postgres.QueryVector(values)}
        through_driver = sql.binary(statement, params)  # type: ignore[attr-defined]
        assert (through_driver is not None) is (driver == "psycopg")
        for rows in (through_driver, sql([(statement, params)])):
            if rows is None:
                continue
            ((dims, text),) = rows
            assert dims == DIM
            stored = np.array(json.loads(text), dtype=np.float32)
            assert np.array_equal(stored, values.astype(np.float32))
    finally:
        engine.dispose()


def test_pbrs_binary_dumpers_leave_the_apps_own_float4_arrays_to_psycopg(
    pgvector_engine: Any,
) -> None:
    """pbr registers its dumpers on the app's pooled connections (for its own classes): the
    app's own ``real[]`` values, in a binary COPY that names their type, still go through
    psycopg's dumper."""
    with pgvector_engine[0].connect() as conn:
        driver = conn.connection.driver_connection
        assert postgres._register_binary(driver)
        with driver.cursor() as cursor:
            cursor.execute("CREATE TEMP TABLE floats (a real[])")
            with cursor.copy("COPY floats (a) FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(["real[]"])
                copy.write_row([[1.0, 2.5]])
            cursor.execute("SELECT a FROM floats")
            assert cursor.fetchall() == [([1.0, 2.5],)]
        conn.rollback()


def test_a_halfvec_column_is_read_in_its_text_form(pgvector_engine: Any) -> None:
    sql = engine_sql(pgvector_engine[0])
    sql(
        [(f"CREATE TABLE half (id text PRIMARY KEY, doc text, meta jsonb, emb halfvec({DIM}))", {})]
    )
    table = PgTable("public", "half", "id", "doc", "meta", "emb")
    host = PgRecords(table, sql, "user_id", _writer(table, sql))
    vector = np.arange(DIM, dtype=np.float32) / 4  # exact in float16
    host.upsert(
        [
            Record(
                key="k",
                user_id="u",
                item_id="i",
                text="t",
                vector=vector,
                metadata={"user_id": "u", "pbr_id": "i"},
            )
        ]
    )
    assert host._vector_select() == '"emb"::text'
    (record,) = host.fetch("u", ["k"])
    assert record.vector is not None and np.array_equal(record.vector, vector)


# -- the derived state shared between workers -----------------------------------------------------

_NOTES = {
    f"n{i}": f"alice note {i} about {'tea' if i % 2 else 'trains'} {i * 7}" for i in range(12)
}


def _worker(engine: Any, embedder: Any) -> Corpus:
    """Another worker: its own corpus and connection pool over the same table."""
    table = PgTable("public", "notes", "id", "doc", "meta", "emb")
    sql = engine_sql(engine)
    return Corpus(PgRecords(table, sql, "user_id", _writer(table, sql)), embedder=embedder)


def _serve(corpus: Corpus, user: str) -> Any:
    """What a request does with a user: read, derive the anchor and BM25 index, rank, share."""
    history = corpus.history(user)
    assert history is not None
    history.anchor(PBRConfig())
    history.lexical()
    terms = {"tea": 1.0, "trains": 1.0}
    hits = corpus.search(user, history, history.vectors[0], terms, 5, mode="hybrid")
    corpus.share_state(user)
    return history, [(h.hit.id, h.hit.score) for h in hits]


def _with_alice(engine: Any, embedder: Any) -> Any:
    """alice's notes written through pbr; returns plain SQL over the same database."""
    writer, _ = _corpus(_records(engine), embedder)
    _add(writer, "alice", _NOTES)
    return engine_sql(engine)


def _alice_shared(engine: Any, embedder: Any) -> Any:
    """alice's notes written, then read cold by a worker that shared their derived state (one
    row of pbr_states); returns plain SQL over the database."""
    sql = _with_alice(engine, embedder)
    _serve(_worker(engine, embedder), "alice")
    assert sql([("SELECT count(*) FROM pbr_states WHERE owner = 'alice'", {})]) == [(1,)]
    return sql


def _refuse_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("built instead of taken from the shared state")

    monkeypatch.setattr("pbr_core.snapshot.compute_anchor", refuse)
    monkeypatch.setattr(LexicalIndex, "build", classmethod(lambda cls, *a, **k: refuse()))


def test_a_worker_that_never_saw_a_user_takes_what_another_derived_and_ranks_alike(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = pgvector_engine[0]
    sql = _with_alice(engine, hash_embedder)
    first, ranked = _serve(_worker(engine, hash_embedder), "alice")  # cold: builds, shares
    rows = sql([("SELECT owner, length(state) FROM pbr_states", {})])
    assert [r[0] for r in rows] == ["alice"] and rows[0][1] > 0
    _refuse_builds(monkeypatch)
    second, ranked_again = _serve(_worker(engine, hash_embedder), "alice")
    assert ranked_again == ranked
    assert np.array_equal(second.anchor(PBRConfig()).vector, first.anchor(PBRConfig()).vector)
    assert [it.id for it in second.items] == [it.id for it in first.items]


def test_any_write_of_a_users_rows_removes_their_state_and_the_next_cold_read_shares_anew(
    pgvector_engine: Any, hash_embedder: Any
) -> None:
    engine = pgvector_engine[0]
    sql = _alice_shared(engine, hash_embedder)
    count = "SELECT count(*) FROM pbr_states WHERE owner = 'alice'"
    # A write that is not pbr's: the trigger removes the state with the revision it bumps.
    sql([("UPDATE notes SET doc = 'alice now rides trains' WHERE meta ->> 'pbr_id' = 'n3'", {})])
    assert sql([(count, {})]) == [(0,)]
    late = _worker(engine, hash_embedder)
    history, _ = _serve(late, "alice")
    assert history.item("n3").text == "alice now rides trains"
    fresh = history.lexical().scores("rides")
    assert fresh[history.position("n3")] > 0  # the index is of the new text
    token = late.host.change_token("alice")  # type: ignore[union-attr]
    rows = sql([("SELECT rev::text FROM pbr_states WHERE owner = 'alice'", {})])
    assert rows == [(_revision_of(token),)]  # shared again, at the rows' revision
    # The user's rows deleted (here by plain SQL): nothing derived from them stays behind.
    sql([("DELETE FROM notes WHERE meta ->> 'user_id' = 'alice'", {})])
    assert sql([(count, {})]) == [(0,)]
    assert _worker(engine, hash_embedder).history("alice") is None


def test_a_state_of_another_revision_is_not_taken(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defence in depth behind the trigger: a state whose revision is not the rows' (written
    by a worker racing a write, or by hand) is never used."""
    engine = pgvector_engine[0]
    sql = _alice_shared(engine, hash_embedder)
    sql([("UPDATE pbr_states SET rev = rev - 1 WHERE owner = 'alice'", {})])
    built: list[int] = []
    real = pbr_core.snapshot.compute_anchor

    def counting(*args: Any, **kwargs: Any) -> Any:
        built.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr("pbr_core.snapshot.compute_anchor", counting)
    _serve(_worker(engine, hash_embedder), "alice")
    assert built == [1]


def test_a_damaged_or_foreign_state_is_detected_warned_and_rebuilt(
    pgvector_engine: Any, hash_embedder: Any, caplog: pytest.LogCaptureFixture
) -> None:
    engine = pgvector_engine[0]
    sql = _with_alice(engine, hash_embedder)
    _add(_worker(engine, hash_embedder), "bob", {"b1": "bob likes tea", "b2": "bob takes trains"})
    _, ranked = _serve(_worker(engine, hash_embedder), "alice")
    _serve(_worker(engine, hash_embedder), "bob")
    sql(
        [
            (
                "UPDATE pbr_states SET state = overlay(state placing '\\xff'::bytea from 90) "
                "WHERE owner = 'alice'",
                {},
            )
        ]
    )
    with caplog.at_level(logging.WARNING, logger="pbr.corpus"):
        _, ranked_damaged = _serve(_worker(engine, hash_embedder), "alice")
    assert "not usable (damaged (checksum mismatch))" in caplog.text
    assert ranked_damaged == ranked  # rebuilt from the rows, which are the truth
    # alice's state under bob's name, at bob's token: refused as another user's.
    sql(
        [
            (
                "UPDATE pbr_states b SET state = a.state FROM pbr_states a "
                "WHERE a.owner = 'alice' AND b.owner = 'bob'",
                {},
            )
        ]
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pbr.corpus"):
        history, _ = _serve(_worker(engine, hash_embedder), "bob")
    assert "the state of another user" in caplog.text
    assert sorted(it.id for it in history.items) == ["b1", "b2"]


@pytest.mark.parametrize(
    ("grants", "warned"),
    [
        ("notes, pbr_revisions, pbr_states", "could not share the derived state"),
        ("notes, pbr_revisions", None),  # may not even read it: cold reads leave it out
    ],
)
def test_a_role_that_may_not_write_or_read_the_state_still_answers(
    pgvector_engine: Any,
    hash_embedder: Any,
    caplog: pytest.LogCaptureFixture,
    grants: str,
    warned: str | None,
) -> None:
    engine = pgvector_engine[0]
    sql = _with_alice(engine, hash_embedder)
    sql([("REVOKE ALL ON pbr_states FROM PUBLIC", {})])
    with _login_as(engine, "pbr_reader", f"SELECT ON {grants}") as reader:
        with caplog.at_level(logging.WARNING, logger="pbr.corpus"):
            worker = _worker(reader, hash_embedder)
            _, ranked = _serve(worker, "alice")
        assert len(ranked) == 5
        assert worker.host.tokens  # type: ignore[union-attr]  # still verified by revision
        if warned:
            assert warned in caplog.text
        else:
            assert not worker.host.states and "pbr:" not in caplog.text  # type: ignore[union-attr]


def test_a_role_that_may_not_read_the_revisions_lists_every_read(
    pgvector_engine: Any, hash_embedder: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The trigger is installed (by another role) but this one may only use the table: it
    cannot read a revision, so every read lists the user, as where there is no trigger."""
    engine = pgvector_engine[0]
    sql = _with_alice(engine, hash_embedder)
    with _login_as(engine, "pbr_app", "SELECT, INSERT, UPDATE, DELETE ON notes") as app:
        with caplog.at_level(logging.WARNING, logger="pbr.postgres"):
            worker = _worker(app, hash_embedder)
        host = worker.host
        assert not host.tokens and not host.states  # type: ignore[union-attr]
        assert "may not read pbr_revisions" in caplog.text
        _, ranked = _serve(worker, "alice")
        assert len(ranked) == 5
        sql([("DELETE FROM notes WHERE meta ->> 'pbr_id' = 'n1'", {})])
        assert "n1" not in [i.id for i in worker.history("alice").items]  # type: ignore[union-attr]


def test_a_write_the_trigger_did_not_see_makes_the_state_unusable(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the trigger disabled, a write leaves the revision and the shared state as they
    were; the digest of the rows read tells the state is of other rows, and it is rebuilt."""
    engine = pgvector_engine[0]
    sql = _alice_shared(engine, hash_embedder)
    sql(
        [
            ("ALTER TABLE notes DISABLE TRIGGER USER", {}),
            ("UPDATE notes SET doc = 'alice rides trains' WHERE meta ->> 'pbr_id' = 'n3'", {}),
            ("ALTER TABLE notes ENABLE TRIGGER USER", {}),
        ]
    )
    assert sql([("SELECT count(*) FROM pbr_states", {})]) == [(1,)]  # the trigger never saw it
    history, _ = _serve(_worker(engine, hash_embedder), "alice")
    assert history.lexical().scores("rides")[history.position("n3")] > 0


def test_a_temporary_table_named_like_pbrs_cannot_catch_the_revision(
    pgvector_engine: Any, hash_embedder: Any
) -> None:
    """A session's temporary tables come first in its search_path; the trigger functions
    search them last, so a writer cannot make a delete invisible to the workers."""
    engine = pgvector_engine[0]
    sql = _with_alice(engine, hash_embedder)
    before = sql([("SELECT rev FROM pbr_revisions WHERE owner = 'alice'", {})])
    engine_sql(engine)(
        [
            (
                "CREATE TEMP TABLE pbr_revisions (tbl oid, user_key text, owner text, rev bigint)",
                {},
            ),
            ("CREATE TEMP TABLE pbr_states (tbl oid, owner text)", {}),
            ("DELETE FROM notes WHERE meta ->> 'pbr_id' = 'n1'", {}),
        ]
    )
    assert sql([("SELECT rev FROM pbr_revisions WHERE owner = 'alice'", {})]) != before


def test_pbrs_tables_are_the_guarded_tables_schemas_whatever_a_workers_search_path(
    pgvector_engine: Any, hash_embedder: Any
) -> None:
    """A table in another schema gets pbr's tables there; a worker whose search_path does not
    name that schema (or names another with pbr's tables) still reads and stamps the right
    ones."""
    from sqlalchemy import create_engine

    engine = pgvector_engine[0]
    sql = engine_sql(engine)
    sql(
        [
            ("CREATE SCHEMA elsewhere", {}),
            ("CREATE SCHEMA other", {}),
            (
                f"CREATE TABLE other.notes (id text PRIMARY KEY, doc text, meta jsonb, "
                f"emb vector({DIM}))",
                {},
            ),
        ]
    )
    table = PgTable("other", "notes", "id", "doc", "meta", "emb")
    _records(engine)  # pbr's tables in public too, for public.notes
    apart = create_engine(engine.url, connect_args={"options": "-csearch_path=elsewhere,public"})
    try:
        for_worker = engine_sql(apart)
        corpus, listed = _corpus(
            PgRecords(table, for_worker, "user_id", _writer(table, for_worker)), hash_embedder
        )
        _add(corpus, "alice", {"x": "alice one", "y": "alice two"})
        assert sql([("SELECT to_regclass('other.pbr_revisions') IS NOT NULL", {})]) == [(True,)]
        assert _ids(corpus, "alice") == ["x", "y"]
        sql([("DELETE FROM other.notes WHERE meta ->> 'pbr_id' = 'x'", {})])
        assert _ids(corpus, "alice") == ["y"]
        n = len(listed)
        assert _ids(corpus, "alice") == ["y"] and len(listed) == n  # unchanged: not listed
        assert corpus.host.change_token("alice") is not None  # type: ignore[union-attr]
    finally:
        apart.dispose()


def test_a_writer_role_needs_no_rights_on_pbrs_own_tables(
    pgvector_engine: Any, hash_embedder: Any
) -> None:
    """The trigger functions run as the role that installed them (security definer): an app
    role granted only its table can write it, and the revision still moves."""
    engine = pgvector_engine[0]
    sql = _with_alice(engine, hash_embedder)
    with _login_as(engine, "pbr_writer", "SELECT, INSERT, UPDATE, DELETE ON notes") as writer:
        before = sql([("SELECT rev FROM pbr_revisions WHERE owner = 'alice'", {})])
        engine_sql(writer)([("DELETE FROM notes WHERE meta ->> 'pbr_id' = 'n1'", {})])
        after = sql([("SELECT rev FROM pbr_revisions WHERE owner = 'alice'", {})])
        assert before != after


def _bulk_host(sql: Any, name: str, columns: str, **table: Any) -> PgRecords:
    sql([(f"CREATE TABLE {name} ({columns})", {})])
    spec = PgTable("public", name, "id", "doc", "meta", "emb", **table)
    return PgRecords(spec, sql, "user_id", _writer(spec, sql), rows=record_rows)


@pytest.mark.parametrize(
    ("columns", "newest", "unique"),
    [
        (f"id text PRIMARY KEY, doc text, meta jsonb, emb vector({DIM})", None, True),
        ("id varchar UNIQUE, doc varchar, meta json, emb vector, n serial", None, True),
        (
            f"n bigserial PRIMARY KEY, id varchar, doc text, meta json, emb vector({DIM})",
            "n",
            False,
        ),
        (
            f"id text PRIMARY KEY, doc text, meta jsonb, emb vector({DIM}), "
            "tsv tsvector GENERATED ALWAYS AS (to_tsvector('simple', doc)) STORED",
            None,
            True,
        ),
    ],
)
def test_a_table_laid_out_as_expected_is_written_in_one_statement(
    pgvector_engine: Any, columns: str, newest: str | None, unique: bool
) -> None:
    sql = engine_sql(pgvector_engine[0])
    host = _bulk_host(sql, "fits", columns, newest=newest)
    plan = host.bulk_plan()
    assert plan is not None and plan.unique_key is unique


@pytest.mark.parametrize(
    "columns",
    [
        f"id text PRIMARY KEY, doc text, meta jsonb, emb halfvec({DIM})",  # not a vector
        f"id text, doc text, meta jsonb, emb vector({DIM})",  # no unique key, no newest
        f"id text PRIMARY KEY, doc text, meta jsonb, emb vector({DIM}), note text",  # unfilled
        f"id text PRIMARY KEY, doc text, meta text, emb vector({DIM})",  # metadata not JSON
        f"id text PRIMARY KEY, doc text, emb vector({DIM})",  # no metadata column
        f"id text, doc text, meta jsonb, emb vector({DIM}), UNIQUE (id, doc)",  # key not alone
    ],
)
def test_any_other_table_keeps_the_frameworks_write(pgvector_engine: Any, columns: str) -> None:
    sql = engine_sql(pgvector_engine[0])
    host = _bulk_host(sql, "other", columns)
    assert host.bulk_plan() is None
    written: list[str] = []
    host._write = lambda records: written.extend(r.key for r in records)  # type: ignore[assignment]
    host.upsert([_record("k", "u", np.ones(DIM, dtype=np.float32))])
    assert written == ["k"]


def _record(key: str, user: str, vector: np.ndarray, **meta: Any) -> Record:
    return Record(
        key=key,
        user_id=user,
        item_id=key,
        text=f"text of {key} — 'quoted' \"too\"",
        vector=vector,
        metadata={"user_id": user, "pbr_id": key, **meta},
    )


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_pbrs_write_stores_what_the_frameworks_write_stores(
    pgvector_engine: Any, driver: str
) -> None:
    """The same records through the framework's write (``_writer``: one INSERT per row, vectors
    as text) and through pbr's one statement (vectors bound in binary with psycopg 3, as a list
    with another driver): the same rows, column by column; written again, replaced in place,
    the revision trigger stamping each write."""
    from sqlalchemy import create_engine

    url = pgvector_engine[0].url.set(drivername=f"postgresql+{driver}")
    engine = create_engine(url)
    try:
        sql = engine_sql(engine)
        framework = _bulk_host(
            sql, "by_framework", f"id text PRIMARY KEY, doc text, meta jsonb, emb vector({DIM})"
        )
        pbr = _bulk_host(
            sql, "by_pbr", f"id text PRIMARY KEY, doc text, meta jsonb, emb vector({DIM})"
        )
        assert pbr.bulk_plan() is not None
        with engine.connect() as conn:  # psycopg 3 binds the vectors in binary, not as a list
            binary = postgres._register_binary(conn.connection.driver_connection)
        assert binary is (driver == "psycopg")
        rng = np.random.default_rng(7)

        def batch(version: int) -> list[Record]:
            return [
                _record(
                    f"k{i}",
                    "alice" if i % 2 else "bob",
                    rng.standard_normal(DIM).astype(np.float32),
                    n=i * version,
                    nested={"a": [1, 2.5, None, True], "é": "ünïcode"},
                )
                for i in range(20)
            ]

        def rows(name: str) -> list[tuple[Any, ...]]:
            return sql(
                [
                    (
                        f"SELECT id, doc, meta::text, emb::text, vector_send(emb) FROM {name} "
                        "ORDER BY id",
                        {},
                    )
                ]
            )

        for version in (1, 2):
            records = batch(version)
            before = pbr.change_token("alice")
            framework._write(records)
            pbr.upsert(records)
            assert rows("by_pbr") == rows("by_framework")
            assert len(rows("by_pbr")) == 20
            assert pbr.change_token("alice") not in (None, before)
        got = {r.key: r.vector for r in pbr.fetch("alice", [r.key for r in records])}
        for r in records:
            if r.user_id == "alice":
                assert np.array_equal(got[r.key], r.vector)
        # a cold read through either driver: the user's rows in key order, read back exactly
        alices = {r.key: r for r in records if r.user_id == "alice"}
        cold = pbr.read_user("alice")
        assert cold is not None and cold.token == pbr.change_token("alice")
        assert [r.key for r in cold.records] == sorted(alices)  # "k1" < "k11" < "k3"
        for r in cold.records:
            wrote = alices[r.key]
            assert np.array_equal(r.vector, wrote.vector)
            assert (r.item_id, r.text) == (wrote.item_id, wrote.text)
            assert r.metadata == {k: v for k, v in wrote.metadata.items() if k != "pbr_id"}
    finally:
        engine.dispose()


def test_a_key_that_is_not_unique_is_replaced_by_delete_and_insert(pgvector_engine: Any) -> None:
    """No unique key (LlamaIndex's ``node_id``): a key written again leaves one row, the new
    one, in a single transaction."""
    sql = engine_sql(pgvector_engine[0])
    host = _bulk_host(
        sql,
        "nodes",
        f"n bigserial PRIMARY KEY, id varchar, doc text, meta json, emb vector({DIM})",
        newest="n",
    )
    first = [_record(f"k{i}", "alice", np.ones(DIM, dtype=np.float32)) for i in range(3)]
    host.upsert(first)
    token = host.change_token("alice")
    second = [_record("k1", "alice", np.arange(1, DIM + 1, dtype=np.float32), v=2)]
    host.upsert(second)
    assert host.change_token("alice") != token
    assert sql([("SELECT id, count(*) FROM nodes GROUP BY id ORDER BY id", {})]) == [
        ("k0", 1),
        ("k1", 1),
        ("k2", 1),
    ]
    (k1,) = host.fetch("alice", ["k1"])
    assert k1.metadata["v"] == 2 and np.array_equal(k1.vector, second[0].vector)


def test_a_connection_lost_under_a_read_is_a_connection_error_and_the_next_read_reconnects(
    pgvector_engine: Any,
) -> None:
    """Reads run by the driver itself (binary results, no transaction) still say "connection
    lost" in the way the adapters turn into VectorStoreUnavailableError, and leave no dead
    connection in the pool."""
    engine = pgvector_engine[0]
    host = _records(engine)
    assert _revision_of(host.change_token("alice")) == "none"  # pooled, in binary form
    import psycopg

    with psycopg.connect(
        engine.url.set(drivername="postgresql").render_as_string(hide_password=False),
        autocommit=True,
    ) as admin:
        # with a timeout (ms), pg_terminate_backend waits until each backend is gone; without
        # one it only signals, and on a loaded machine the next read could reach a backend
        # that has not exited yet
        admin.execute(
            "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    with pytest.raises(ConnectionError, match="connection was lost"):
        host.change_token("alice")
    assert _revision_of(host.change_token("alice")) == "none"


def test_a_read_gives_the_pooled_connection_back_as_it_was_lent(pgvector_engine: Any) -> None:
    """pbr's reads run in autocommit on the driver; an app's engine made with autocommit must
    get its connections back in autocommit, one without it back without."""
    from sqlalchemy import create_engine, text

    engine = pgvector_engine[0]
    auto = create_engine(engine.url, isolation_level="AUTOCOMMIT", pool_size=1, max_overflow=0)
    try:
        table, sql = _table(engine)
        host = PgRecords(table, engine_sql(auto), "user_id", _writer(table, sql))
        assert _revision_of(host.change_token("alice")) == "none"
        with auto.connect() as conn:  # the same pooled connection: no commit needed
            assert conn.connection.driver_connection.autocommit
            conn.execute(text("CREATE TABLE kept (x int)"))
        assert engine_sql(engine)([("SELECT to_regclass('kept') IS NOT NULL", {"x": 1})]) == [
            (True,)
        ]
        host = PgRecords(table, engine_sql(engine), "user_id", _writer(table, sql))
        assert _revision_of(host.change_token("alice")) == "none"
        with engine.connect() as conn:
            assert not conn.connection.driver_connection.autocommit
    finally:
        auto.dispose()


def test_a_worker_that_builds_more_than_it_took_shares_the_fuller_state(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dense-only request shares anchors without a BM25 index; the next cold worker takes
    them, builds the index for its hybrid request and shares both; a third builds nothing."""
    engine = pgvector_engine[0]
    _with_alice(engine, hash_embedder)
    first = _worker(engine, hash_embedder)
    history = first.history("alice")
    assert history is not None
    history.anchor(PBRConfig())  # what a dense request builds
    first.share_state("alice")
    second = _worker(engine, hash_embedder)
    taken = second.history("alice")
    assert taken is not None and not taken.lexical_indexes() and taken._anchors
    taken.lexical()
    second.share_state("alice")
    _refuse_builds(monkeypatch)
    third, _ = _serve(_worker(engine, hash_embedder), "alice")
    assert third.lexical_indexes()


def _storage(sql: Any) -> str:
    rows = sql(
        [
            (
                "SELECT attstorage FROM pg_attribute WHERE attrelid = 'pbr_states'::regclass "
                "AND attname = 'state'",
                {},
            )
        ]
    )
    return str(rows[0][0])


def test_states_are_kept_uncompressed_and_an_older_install_is_upgraded(
    pgvector_engine: Any,
) -> None:
    """pglz would halve a state at ~4.5 ms per 200 kB written, on a request's path: pbr's
    setup stores states uncompressed (``STORAGE EXTERNAL``), also where an earlier pbr made
    the table."""
    engine = pgvector_engine[0]
    host = _records(engine)
    assert _storage(host.sql) == "e"
    host.sql([("ALTER TABLE pbr_states ALTER COLUMN state SET STORAGE EXTENDED", {})])
    assert _storage(host.sql) == "x"  # as an earlier pbr left it
    again = PgRecords(host.table, host.sql, "user_id", _writer(host.table, host.sql))
    assert again.states
    assert _storage(host.sql) == "e"


def test_a_role_that_does_not_own_pbr_states_leaves_its_storage_without_setting_up_again(
    pgvector_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Storage is a speed setting, not part of a current install: an app role that may only
    read and write keeps the install as it is, with no DDL and no warning."""
    engine = pgvector_engine[0]
    host = _records(engine)
    host.sql([("ALTER TABLE pbr_states ALTER COLUMN state SET STORAGE EXTENDED", {})])
    with _login_as(
        engine,
        "pbr_reader",
        "SELECT, INSERT, UPDATE, DELETE ON notes",
        "SELECT, INSERT, UPDATE, DELETE ON pbr_states",
        "SELECT ON pbr_revisions",
    ) as app:
        app_sql = engine_sql(app)
        with caplog.at_level(logging.DEBUG, logger="pbr.postgres"):
            reader = PgRecords(host.table, app_sql, "user_id", _writer(host.table, app_sql))
        assert reader.tokens and reader.states
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert _storage(host.sql) == "x"  # not this role's to change


def test_pbrs_write_encodes_metadata_with_the_engines_json_encoder(pgvector_engine: Any) -> None:
    """``create_engine(json_serializer=...)`` is how the framework writes JSON; a ``json``
    column keeps the text as it is, so pbr's own write uses the same encoder."""
    from sqlalchemy import create_engine

    engine = create_engine(
        pgvector_engine[0].url,
        json_serializer=lambda value: json.dumps(value, separators=(",", ":")),
    )
    try:
        host = _bulk_host(
            engine_sql(engine),
            "compact_json",
            f"id text PRIMARY KEY, doc text, meta json, emb vector({DIM})",
        )
        assert host.bulk_plan() is not None
        host.upsert([_record("k1", "alice", np.ones(DIM, dtype=np.float32), note="a b")])
        stored = host.sql([("SELECT meta::text FROM compact_json", {})])[0][0]
        assert stored == '{"user_id":"alice","pbr_id":"k1","note":"a b"}'
    finally:
        engine.dispose()


def test_a_cold_read_decodes_metadata_with_the_engines_json_decoder(pgvector_engine: Any) -> None:
    """``create_engine(json_deserializer=...)`` reads a cold user's metadata as a listing
    reads it (here: 0.1 as Decimal("0.1"), not a float), so both give one revision of each row."""
    from decimal import Decimal

    from sqlalchemy import create_engine

    engine = create_engine(
        pgvector_engine[0].url,
        json_deserializer=lambda text: json.loads(text, parse_float=Decimal),
    )
    try:
        host = _records(engine)
        vector = np.ones(DIM, dtype=np.float32)
        host._write([_record("k1", "alice", vector, price=0.1)])
        cold = host.read_user("alice")
        assert cold is not None
        listed = host.list_user("alice")
        assert cold.records[0].metadata["price"] == Decimal("0.1")  # not the float 0.1
        assert [r.metadata for r in cold.records] == [r.metadata for r in listed]
    finally:
        engine.dispose()


def test_rows_that_share_a_key_are_read_in_one_order_on_every_worker(
    pgvector_engine: Any,
) -> None:
    """Keys are unique for every bundled store, but nothing enforces it: rows sharing a key come
    in one order (then by text) whatever order the server returns them in."""
    sql = engine_sql(pgvector_engine[0])
    sql([(f"CREATE TABLE shared_keys (id text, doc text, meta jsonb, emb vector({DIM}))", {})])
    spec = PgTable("public", "shared_keys", "id", "doc", "meta", "emb")
    host = PgRecords(spec, sql, "user_id", _writer(spec, sql))
    for text in ("b second", "a first", "c third"):  # heap order: b, a, c
        sql(
            [
                (
                    "INSERT INTO shared_keys VALUES ('k', :doc, "
                    '\'{"user_id": "alice", "pbr_id": "x"}\', CAST(:emb AS vector))',
                    {"doc": text, "emb": json.dumps([1.0] * DIM)},
                )
            ]
        )
    cold = host.read_user("alice")
    assert cold is not None
    assert [r.text for r in cold.records] == ["a first", "b second", "c third"]


def test_a_state_of_another_pbr_version_is_rebuilt_without_a_warning(
    pgvector_engine: Any,
    hash_embedder: Any,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After an upgrade every user's state is an older version's: rebuilt and shared anew,
    logged at debug level, not warned about once per user."""
    engine = pgvector_engine[0]
    _alice_shared(engine, hash_embedder)
    _, ranked = _serve(_worker(engine, hash_embedder), "alice")
    monkeypatch.setattr("pbr_core.derived._PBR", "9.9.9")  # the next version of pbr
    with caplog.at_level(logging.DEBUG, logger="pbr.corpus"):
        _, upgraded = _serve(_worker(engine, hash_embedder), "alice")
    assert upgraded == ranked
    mentions = [r for r in caplog.records if "another version's" in r.getMessage()]
    assert mentions and all(r.levelno == logging.DEBUG for r in mentions)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_dropped_table_leaves_no_derived_state_once_pbr_sets_up_again(
    pgvector_engine: Any, hash_embedder: Any
) -> None:
    engine = pgvector_engine[0]
    sql = _alice_shared(engine, hash_embedder)
    sql([("DROP TABLE notes", {})])  # the item ids and words of alice's state stay behind ...
    _records(engine, "other_notes")  # ... until pbr sets up a table again
    assert sql([("SELECT count(*) FROM pbr_states", {})]) == [(0,)]


def test_an_owner_key_holding_a_colon_sets_up_and_reads_its_users_rows(
    pgvector_engine: Any, hash_embedder: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """SQLAlchemy's ``text()`` reads ``:user`` as a placeholder even inside a quoted literal:
    an owner key ``"t :user"`` in ``meta ->> 't :user'`` must stay the key, not become a
    parameter (before: the setup failed with a warning, and a read found no rows at all)."""
    engine = pgvector_engine[0]
    table, sql = _table(engine)
    with caplog.at_level(logging.WARNING, logger="pbr.postgres"):
        host = PgRecords(table, sql, "t :user", _writer(table, sql))
    assert host.tokens and caplog.text == ""
    corpus = Corpus(host, embedder=hash_embedder, user_key="t :user")
    _add(corpus, "alice", {"x": "alice pin is 4321", "y": "alice likes tea"})
    _add(corpus, "bob", {"x": "bob likes jazz"})
    other_host = PgRecords(table, sql, "t :user", _writer(table, sql))
    other = Corpus(other_host, embedder=hash_embedder, user_key="t :user")
    assert _ids(other, "alice") == ["x", "y"] and _ids(other, "bob") == ["x"]
    assert host.change_token("alice") is not None


@contextlib.contextmanager
def _async_sql(pgvector_engine: Any, driver: str) -> Iterator[Any]:
    """:func:`pbr_core.postgres.async_engine_sql` over an async engine of ``driver``, on an
    event loop of its own (as LangChain's ``PGEngine`` runs one)."""
    from sqlalchemy.ext.asyncio import create_async_engine

    url = pgvector_engine[0].url.set(drivername=f"postgresql+{driver}")
    if driver == "asyncpg":
        url = url.difference_update_query(["sslmode"])
    engine = create_async_engine(url)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield postgres.async_engine_sql(
            engine, lambda coro: asyncio.run_coroutine_threadsafe(coro, loop).result()
        )
    finally:
        asyncio.run_coroutine_threadsafe(engine.dispose(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
def test_statements_without_parameters_run_in_the_calls_transaction_on_every_driver(
    pgvector_engine: Any, driver: str
) -> None:
    """The setup's advisory lock and DDL are statements without parameters, sent to the driver
    as they are: under asyncpg they ran before SQLAlchemy had opened the transaction, so the
    lock was released at once and a failed setup's DDL stayed (before; psycopg was fine)."""
    with _async_sql(pgvector_engine, driver) as sql:
        held = sql(
            [
                ("SELECT pg_advisory_xact_lock(42)", {}),
                (
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = "
                    "pg_backend_pid() AND granted AND :one = 1",
                    {"one": 1},
                ),
            ]
        )
        assert held[0][0] == 1
        with pytest.raises(Exception, match="division by zero"):
            sql(
                [
                    (f"CREATE TABLE probe_{driver} (x int)", {}),
                    ("SELECT 1 / 0 WHERE :x = 1", {"x": 1}),
                ]
            )
        left = sql([("SELECT to_regclass(:t) IS NOT NULL", {"t": f"probe_{driver}"})])
        assert left[0][0] is False


@pytest.mark.parametrize("driver", ["psycopg (sync)", "psycopg", "asyncpg"])
def test_a_long_row_is_read_afterwards_only_as_the_very_version_ranked_on_every_driver(
    pgvector_engine: Any, hash_embedder: Any, driver: str
) -> None:
    """What a view reads of a long row after ranking it (``PgRecords._shown``, found by its
    place): the row only if its key and version are those ranked and it is the user's; over
    every driver (asyncpg binds a place only from a tuple: the places go as text)."""
    engine = pgvector_engine[0]
    _many_written(engine, hash_embedder)
    table = PgTable("public", "notes", "id", "doc", "meta", "emb")
    key, tid, xmin = engine_sql(engine)(
        [("SELECT id, ctid::text, xmin::text FROM notes WHERE meta->>'pbr_id' = 'm07'", {})]
    )[0]
    context = (
        contextlib.nullcontext(engine_sql(engine))
        if driver == "psycopg (sync)"
        else _async_sql(pgvector_engine, driver)
    )
    with context as sql:
        host = PgRecords(table, sql, "user_id", _writer(table, sql))
        got = host._shown("alice", [key], [xmin], [tid], [0])
        assert [(r.item_id, r.text) for r in got] == [("m07", _MANY["m07"])]  # type: ignore[union-attr]
        assert host._shown("alice", [key], [str(int(xmin) + 1)], [tid], [0]) == [None]  # version
        assert host._shown("alice", ["another key"], [xmin], [tid], [0]) == [None]  # not this row
        assert host._shown("bob", [key], [xmin], [tid], [0]) == [None]  # not bob's


# -- a cold user ranked in the database (pbr_core.view) ---------------------------------------
_MANY = {
    f"m{i:02d}": f"alice {'tea' if i % 3 else 'trains'} note {i} at {i % 7} pm {'green' * (i % 2)}"
    for i in range(40)
}


def _personalizer(engine: Any, embedder: Any, **config: Any) -> Personalizer:
    return Personalizer(corpus=_worker(engine, embedder), config=PBRConfig(**config))


def _many_written(engine: Any, embedder: Any) -> Corpus:
    """alice's many notes written through pbr; returns the writer."""
    writer, _ = _corpus(_records(engine), embedder)
    _add(writer, "alice", _MANY)
    return writer


def _many_shared(engine: Any, embedder: Any) -> Corpus:
    """alice's many notes written, then searched by a worker that read her cold and shared
    her derived state; returns the writer."""
    writer = _many_written(engine, embedder)
    _personalizer(engine, embedder, fusion="no_prf").search("alice", "tea", 5)
    return writer


def _answer(got: Any) -> Any:
    """What a search answers: the results with their scores and legs, and the explanation's
    related and central items."""
    expl = got.personalized.explanation
    return (
        [(h.id, round(h.score, 5), h.text, h.metadata, h.legs) for h in got.hits],
        [(h.id, h.text) for h in expl.related],
        [(h.id, h.text) for h in expl.anchor_items],
        expl.used,
    )


def _counting_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each call of a cold read (rows with vectors), by the calling thread's name."""
    calls: list[str] = []
    real = PgRecords.read_user

    def counted(self: PgRecords, user_id: str) -> Any:
        calls.append(threading.current_thread().name)
        return real(self, user_id)

    monkeypatch.setattr(PgRecords, "read_user", counted)
    return calls


def _cached_soon(corpus: Corpus, user: str) -> bool:
    deadline = time.monotonic() + 10
    while user not in corpus.cache and time.monotonic() < deadline:
        time.sleep(0.01)
    return user in corpus.cache


# (plain fusion with dense search derives nothing, so nothing is shared: read as before)
@pytest.mark.parametrize(
    ("fusion", "search"),
    [("no_prf", "hybrid"), ("no_prf", "dense"), ("no_prf", "lexical"), ("plain", "hybrid")],
)
def test_a_cold_worker_ranks_a_shared_user_in_the_database_as_a_warm_one_would(
    pgvector_engine: Any,
    hash_embedder: Any,
    monkeypatch: pytest.MonkeyPatch,
    search: str,
    fusion: str,
) -> None:
    engine = pgvector_engine[0]
    writer = _many_written(engine, hash_embedder)
    _add(writer, "bob", {"m00": "bob tea note about trains"})
    config = {"fusion": fusion, "search": search}
    first = _personalizer(engine, hash_embedder, **config)
    expected = _answer(first.search("alice", "green tea at night", 7))  # cold: reads, shares
    reads = _counting_reads(monkeypatch)
    cold = _personalizer(engine, hash_embedder, **config)
    got = cold.search("alice", "green tea at night", 7)
    assert _answer(got) == expected
    assert "MainThread" not in reads  # ranked in the database: the request read no rows
    assert _cached_soon(cold.corpus, "alice")  # read after the request, in the background
    assert _answer(cold.search("alice", "green tea at night", 7)) == expected  # warm


def test_an_async_cold_request_is_ranked_in_the_database_too(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = pgvector_engine[0]
    _many_written(engine, hash_embedder)
    expected = _answer(
        _personalizer(engine, hash_embedder, fusion="no_prf").search("alice", "tea", 5)
    )
    reads = _counting_reads(monkeypatch)
    cold = _personalizer(engine, hash_embedder, fusion="no_prf")
    got = asyncio.run(cold.asearch("alice", "tea", 5))
    assert _answer(got) == expected
    assert not [name for name in reads if not name.startswith("pbr-read-later")]


def test_a_user_without_a_shared_state_is_read_as_before(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = pgvector_engine[0]
    _many_written(engine, hash_embedder)
    reads = _counting_reads(monkeypatch)
    got = _personalizer(engine, hash_embedder, fusion="no_prf").search("alice", "tea", 5)
    assert len(got.hits) == 5 and reads == ["MainThread"]


def _counting_views(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each scored read (a request ranked in the database), by user."""
    calls: list[str] = []
    real = PgRecords.read_scored

    def counted(self: PgRecords, user_id: str, *args: Any) -> Any:
        calls.append(user_id)
        return real(self, user_id, *args)

    monkeypatch.setattr(PgRecords, "read_scored", counted)
    return calls


def _off_the_span(inputs: FusionInputs) -> FusionResult:
    """A fusion rule whose q* leaves the span of q and the anchor."""
    result = default_rule(inputs)
    other = np.roll(inputs.q, 1)
    return dataclasses.replace(result, vector=result.vector + 0.5 * other)


def test_a_request_the_view_cannot_rank_reads_the_users_rows(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decided before anything is read: neighbour context (it reads the neighbours of every
    item). Found while ranking: a fusion rule whose q* the cosines cannot give."""
    engine = pgvector_engine[0]
    _many_written(engine, hash_embedder)
    expected = _answer(
        _personalizer(engine, hash_embedder, fusion="no_prf").search("alice", "tea", 5)
    )
    views, reads = _counting_views(monkeypatch), _counting_reads(monkeypatch)
    context = _personalizer(engine, hash_embedder, fusion="no_prf", lexical_context=0.5)
    assert len(context.search("alice", "tea", 5).hits) == 5
    assert (views, reads) == ([], ["MainThread"])
    own_rule = Personalizer(
        corpus=_worker(engine, hash_embedder),
        config=PBRConfig(fusion="no_prf"),
        fusion_rule=_off_the_span,
    )
    warm = Personalizer(
        corpus=_worker(engine, hash_embedder),
        config=PBRConfig(fusion="no_prf"),
        fusion_rule=_off_the_span,
    )
    warm.corpus.history("alice")  # read first: ranked on its rows
    assert _answer(own_rule.search("alice", "tea", 5)) == _answer(warm.search("alice", "tea", 5))
    assert views == ["alice"]  # tried, then the rows read
    assert expected != _answer(own_rule.search("alice", "tea", 5))


def test_a_row_that_is_not_the_item_the_state_says_is_not_shown_from_it(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row whose item is not the one the state holds at its key (here: the metadata's id
    changed with the triggers off, so the token still moved, and then the state put back) is
    never shown as that item: the request reads the user's rows."""
    engine = pgvector_engine[0]
    _many_shared(engine, hash_embedder)
    real = PgRecords.read_scored

    def other_item(self: PgRecords, user_id: str, q: Any) -> Any:
        rows = real(self, user_id, q)
        return dataclasses.replace(
            rows,
            records=lambda at: [
                dataclasses.replace(r, item_id="someone-else") for r in rows.records(at)
            ],
        )

    monkeypatch.setattr(PgRecords, "read_scored", other_item)
    views, reads = _counting_views(monkeypatch), _counting_reads(monkeypatch)
    got = _personalizer(engine, hash_embedder, fusion="no_prf").search("alice", "tea", 5)
    assert views == ["alice"] and reads == ["MainThread"]  # the view gave up: rows read
    assert len(got.hits) == 5 and "someone-else" not in {h.id for h in got.hits}


def _texts_read_later(monkeypatch: pytest.MonkeyPatch) -> None:
    """No row's text comes with the scored read (as for texts longer than
    :data:`~pbr_core.postgres.INLINE_BYTES`): they are read for the rows shown."""
    monkeypatch.setattr(postgres, "INLINE_BYTES", 0)


def test_short_rows_come_with_the_scored_read_and_long_ones_are_read_for_the_rows_shown(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chat-length row's text and metadata come with the scores (no second statement); a
    row longer than INLINE_BYTES is read afterwards, only if shown."""
    engine = pgvector_engine[0]
    writer = _many_written(engine, hash_embedder)
    long_note = "alice long tea note " + "about the green tea she brews " * 20
    assert len(long_note) > postgres.INLINE_BYTES
    _add(writer, "alice", {"long": long_note})
    _personalizer(engine, hash_embedder, fusion="no_prf").search("alice", "tea", 5)  # shares
    shown = _counting_shown(monkeypatch)
    views, reads = _counting_views(monkeypatch), _counting_reads(monkeypatch)
    got = _personalizer(engine, hash_embedder, fusion="no_prf").search("alice", "tea", 41)
    assert views == ["alice"] and "MainThread" not in reads  # ranked in the database
    texts = {h.id: h.text for h in got.hits}  # every item, each with its own text
    assert texts == {**_MANY, "long": long_note}
    assert len(shown) == 1 and len(shown[0][1]) == 1  # one read, of the long note only


def test_a_cold_request_reads_the_text_of_only_the_rows_it_may_show(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scored read brings no text or metadata: the request reads them afterwards, in one
    statement, for the rows it may show (its related items and the best of each leg); a
    result outside them would be read by one more (here none is)."""
    _texts_read_later(monkeypatch)
    engine = pgvector_engine[0]
    _many_shared(engine, hash_embedder)
    shown = _counting_shown(monkeypatch)
    views, reads = _counting_views(monkeypatch), _counting_reads(monkeypatch)
    worker = _personalizer(engine, hash_embedder, fusion="no_prf")
    got = worker.search("alice", "tea", 5)
    assert views == ["alice"] and "MainThread" not in reads  # ranked in the database
    assert len(shown) == 1  # the results were among the rows read with the related items
    read = shown[0][1]
    related = got.personalized.explanation.related
    assert len(read) <= len(related) + 2 * 5 < len(_MANY)
    assert all(h.text == _MANY[h.id] for h in [*got.hits, *related])


def _only_related(view: ScoredView, related: int, *_: Any) -> list[int]:
    """A guess of the rows a request shows that holds only its related items."""
    return [pos for pos, _ in view.search(view.q, related)]


def _read_first(engine: Any, embedder: Any, k: int) -> Any:
    """What a worker that reads alice's rows first (no view) answers to "tea"."""
    worker = _personalizer(engine, embedder, fusion="no_prf")
    worker.corpus.rank_cold_in_database = False
    return _answer(worker.search("alice", "tea", k))


def _read_by_the_results_step(monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], list[str]]:
    """Only the related items read ahead, so the results' long rows are read by the results'
    step: the long rows' reads (thread, where) and the users ranked in the database, counted."""
    monkeypatch.setattr(ScoredView, "likely_shown", _only_related)
    return _counting_shown(monkeypatch), _counting_views(monkeypatch)


def test_a_result_outside_the_likely_rows_is_read_by_the_results_step(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _texts_read_later(monkeypatch)
    engine = pgvector_engine[0]
    _many_shared(engine, hash_embedder)
    expected = _read_first(engine, hash_embedder, 8)
    shown, views = _read_by_the_results_step(monkeypatch)
    reads = _counting_reads(monkeypatch)
    got = _personalizer(engine, hash_embedder, fusion="no_prf").search("alice", "tea", 8)
    assert views == ["alice"] and "MainThread" not in reads and _answer(got) == expected
    assert len(shown) == 2  # the related items, then the results not among them


def test_a_row_rewritten_before_the_results_step_is_not_shown_from_it(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write committed after the related items were read and before the results' rows are:
    the results are not shown from rows of another version; the request reads the rows."""
    _texts_read_later(monkeypatch)
    engine = pgvector_engine[0]
    _many_shared(engine, hash_embedder)
    monkeypatch.setattr(ScoredView, "likely_shown", _only_related)
    sql = engine_sql(engine)
    real = PgRecords._shown
    calls: list[int] = []

    def then_rewritten(self: PgRecords, *args: Any) -> Any:
        got = real(self, *args)
        calls.append(len(calls))
        if len(calls) == 1:  # after the related items' read
            sql(
                [("UPDATE notes SET doc = doc || ' (edited)' WHERE meta->>'user_id' = 'alice'", {})]
            )
        return got

    monkeypatch.setattr(PgRecords, "_shown", then_rewritten)
    reads = _counting_reads(monkeypatch)
    got = _personalizer(engine, hash_embedder, fusion="no_prf").search("alice", "tea", 8)
    assert len(calls) == 2 and reads == ["MainThread"]  # the results' read gave up: rows read
    assert len(got.hits) == 8 and all(h.text == _MANY[h.id] + " (edited)" for h in got.hits)


def test_a_view_reads_the_host_only_in_the_steps_that_read_it(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An item the view's own steps did not read (here: none read ahead) is not read by the
    personalization step (on an async request's event loop): the request reads the rows."""
    _texts_read_later(monkeypatch)
    engine = pgvector_engine[0]
    _many_shared(engine, hash_embedder)
    expected = _read_first(engine, hash_embedder, 5)
    monkeypatch.setattr(ScoredView, "likely_shown", lambda *_: [])
    shown = _counting_shown(monkeypatch)
    views, reads = _counting_views(monkeypatch), _counting_reads(monkeypatch)
    got = _personalizer(engine, hash_embedder, fusion="no_prf").search("alice", "tea", 5)
    assert views == ["alice"] and reads == ["MainThread"] and not shown
    assert _answer(got) == expected


def _counting_shown(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[int]]]:
    """Each read of shown rows' texts: the calling thread's name and the positions read."""
    calls: list[tuple[str, list[int]]] = []
    real = PgRecords._shown

    def counted(self: PgRecords, user_id: str, *where: Any) -> Any:
        calls.append((threading.current_thread().name, list(where[-1])))  # the positions
        return real(self, user_id, *where)

    monkeypatch.setattr(PgRecords, "_shown", counted)
    return calls


def test_an_async_cold_request_reads_the_shown_texts_off_the_event_loop(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _texts_read_later(monkeypatch)
    engine = pgvector_engine[0]
    _many_shared(engine, hash_embedder)
    shown, views = _read_by_the_results_step(monkeypatch)
    got = asyncio.run(
        _personalizer(engine, hash_embedder, fusion="no_prf").asearch("alice", "tea", 8)
    )
    assert views == ["alice"] and len(got.hits) == 8
    assert len(shown) == 2 and all(thread != "MainThread" for thread, _ in shown)  # off the loop


def test_a_row_rewritten_between_the_scored_read_and_its_text_is_not_shown_from_it(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row whose version changed after the cosines were computed (a write committed between
    the two statements) is not shown with the new text under the old ranking: the request
    reads the user's rows and ranks them as they are now."""
    _texts_read_later(monkeypatch)
    engine = pgvector_engine[0]
    _many_shared(engine, hash_embedder)
    sql = engine_sql(engine)
    real = PgRecords.read_scored

    def then_rewritten(self: PgRecords, user_id: str, q: Any) -> Any:
        rows = real(self, user_id, q)
        sql([("UPDATE notes SET doc = doc || ' (edited)' WHERE meta ->> 'user_id' = 'alice'", {})])
        return rows

    monkeypatch.setattr(PgRecords, "read_scored", then_rewritten)
    reads = _counting_reads(monkeypatch)
    got = _personalizer(engine, hash_embedder, fusion="no_prf").search("alice", "tea", 5)
    assert reads == ["MainThread"]  # the view gave up: rows read
    assert len(got.hits) == 5 and all(h.text == _MANY[h.id] + " (edited)" for h in got.hits)


def test_rows_the_state_does_not_describe_are_read_not_ranked_from_the_state(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row written with the trigger's revision left behind (here: the state put back by
    hand after a write) is not in the state's keys: the view is not used."""
    engine = pgvector_engine[0]
    writer = _many_written(engine, hash_embedder)
    sql = engine_sql(engine)
    _personalizer(engine, hash_embedder, fusion="no_prf").search("alice", "tea", 5)  # shares
    saved = sql([("SELECT tbl, owner, reader, state FROM pbr_states", {})])
    _add(writer, "alice", {"new": "alice new note about tea"})
    rev = sql([("SELECT rev FROM pbr_revisions WHERE owner = 'alice'", {})])[0][0]
    sql(
        [
            (
                "INSERT INTO pbr_states (tbl, owner, reader, rev, state) "
                "VALUES (:t, :o, :r, :v, :s)",
                {"t": saved[0][0], "o": saved[0][1], "r": saved[0][2], "v": rev, "s": saved[0][3]},
            )
        ]
    )
    views, reads = _counting_views(monkeypatch), _counting_reads(monkeypatch)
    got = _personalizer(engine, hash_embedder, fusion="no_prf").search("alice", "new note", 41)
    assert views == ["alice"] and reads == ["MainThread"] and "new" in {h.id for h in got.hits}


def _floats(embedder: Any, text: str) -> list[float]:
    return [float(x) for x in embedder.embed_query(text)]


def _notes_by_hand(
    engine: Any, embedder: Any, keys: Sequence[str | None], text_type: str = "text"
) -> None:
    """alice's notes written by SQL under ``keys`` (a key column without a constraint), their
    texts in a column of ``text_type``."""
    sql = engine_sql(engine)
    sql([(f"CREATE TABLE notes (id text, doc {text_type}, meta jsonb, emb vector({DIM}))", {})])
    for i, key in enumerate(keys):
        text = f"alice note {i} about {'tea' if i % 2 else 'trains'}"
        meta = json.dumps({"user_id": "alice", "pbr_id": f"m{i}"})
        emb = json.dumps(_floats(embedder, text))
        sql(
            [
                (
                    "INSERT INTO notes VALUES (:id, :doc, CAST(:meta AS jsonb), "
                    "CAST(:emb AS vector))",
                    {"id": key, "doc": text, "meta": meta, "emb": emb},
                )
            ]
        )


def test_a_scored_read_gives_each_rows_cosine_text_and_version_in_code_point_key_order(
    pgvector_engine: Any, hash_embedder: Any
) -> None:
    """The rows come in any order and are put in key order here (code points, a NULL key
    last): each key keeps its own cosine, version and text."""
    engine = pgvector_engine[0]
    keys = ["b", None, "€", "a", "é"]
    _notes_by_hand(engine, hash_embedder, keys)
    _personalizer(engine, hash_embedder, fusion="no_prf").search("alice", "tea", 3)  # a state
    host = _worker(engine, hash_embedder).host
    q = np.asarray(_floats(hash_embedder, "tea"), dtype=np.float64)
    q /= np.linalg.norm(q)
    got = host.read_scored("alice", q)  # type: ignore[union-attr]
    assert got is not None and got.state is not None
    assert got.keys == ["a", "b", "é", "€", None]
    versions = dict(engine_sql(engine)([("SELECT id, xmin::text FROM notes", {})]))
    for i, key in enumerate(got.keys):
        assert got.stamps[i] == versions[key]
        if key is None:
            continue
        text = f"alice note {keys.index(key)} about {'tea' if keys.index(key) % 2 else 'trains'}"
        (record,) = got.records([i])
        assert record is not None and record.text == text
        vector = np.asarray(_floats(hash_embedder, text), dtype=np.float64)
        assert got.cosines[i] == pytest.approx(vector @ q / np.linalg.norm(vector), abs=1e-6)


def _scored_functions(engine: Any) -> list[str]:
    rows = engine_sql(engine)(
        [("SELECT proname FROM pg_proc WHERE proname LIKE 'pbr\\_scored\\_%' ORDER BY 1", {})]
    )
    return [r[0] for r in rows]


def _tea(embedder: Any) -> np.ndarray:
    q = np.asarray(_floats(embedder, "tea"), dtype=np.float64)
    return q / np.linalg.norm(q)


def _scored_read(engine: Any, embedder: Any, user: str = "alice") -> Any:
    """A new worker's scored read of ``user``'s rows, and the worker's host."""
    host = _worker(engine, embedder).host
    return host.read_scored(user, _tea(embedder)), host  # type: ignore[union-attr]


def _six_shared(engine: Any, embedder: Any, text_type: str = "text") -> None:
    """alice's six notes written by SQL, then read by a worker that shared her state."""
    _notes_by_hand(engine, embedder, [f"k{i:02d}" for i in range(6)], text_type)
    _personalizer(engine, embedder, fusion="no_prf").search("alice", "tea", 3)


@pytest.mark.parametrize("text_type", ["text", "varchar"])  # LangChain's and LlamaIndex's
def test_the_scored_read_runs_through_one_function_whose_plan_the_server_keeps(
    pgvector_engine: Any, hash_embedder: Any, text_type: str
) -> None:
    """The statement of a scored read is made a PL/pgSQL function once (whoever comes
    first), and every worker reading the table that way calls it: the server keeps its plan
    whatever the app's pool does to psycopg's prepared statements. It reads what the statement
    reads."""
    engine = pgvector_engine[0]
    _six_shared(engine, hash_embedder, text_type)
    through, host = _scored_read(engine, hash_embedder)
    assert through.state is not None and len(through.keys) == 6
    assert (host._scored_call or "").startswith("SELECT * FROM")
    assert len(_scored_functions(engine)) == 1
    _, other = _scored_read(engine, hash_embedder)
    assert other._scored_call == host._scored_call and len(_scored_functions(engine)) == 1
    other._scored_call = ""  # the statement itself
    direct = other.read_scored("alice", _tea(hash_embedder))
    assert other._scored_call == ""
    assert (through.token, through.state, through.keys, through.stamps) == (
        direct.token,
        direct.state,
        direct.keys,
        direct.stamps,
    )
    assert np.array_equal(through.cosines, direct.cosines)


def test_a_scored_read_whose_function_is_gone_runs_the_statement(
    pgvector_engine: Any, hash_embedder: Any
) -> None:
    engine = pgvector_engine[0]
    _six_shared(engine, hash_embedder)
    first, host = _scored_read(engine, hash_embedder)
    (name,) = _scored_functions(engine)
    engine_sql(engine)([(f"DROP FUNCTION {name}", {})])
    again = host.read_scored("alice", _tea(hash_embedder))  # type: ignore[union-attr]
    assert host._scored_call == "" and again.state == first.state and again.keys == first.keys


#: pbr's scored-read function: its name, its arguments and its result.
_FUNCTION_OF_NOTES = (
    "SELECT oid::regproc::text, pg_get_function_identity_arguments(oid), "
    "pg_get_function_result(oid) FROM pg_proc WHERE proname LIKE 'pbr\\_scored\\_%'"
)


def _impostor(name: str, args: str, result: str) -> str:
    """A function named as pbr's that answers one empty row."""
    body = (
        "BEGIN RETURN QUERY SELECT 1::bigint, ''::text, 1::bigint, ''::bytea, '{}'::text[], "
        "'{}'::float8[], '{}'::text[], '{}'::text[], '{}'::text[]; END"
    )
    return f"CREATE FUNCTION {name}({args}) RETURNS {result} LANGUAGE plpgsql AS $f$ {body} $f$"


def test_a_connection_lost_during_the_function_call_is_raised_and_the_function_kept(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = pgvector_engine[0]
    _six_shared(engine, hash_embedder)
    _, host = _scored_read(engine, hash_embedder)
    call = host._scored_call
    assert call

    def lost(self: Any, statement: str, params: Any) -> Any:
        raise ConnectionError("the PostgreSQL connection was lost: server closed the connection")

    monkeypatch.setattr(type(host.sql), "binary", lost)
    with pytest.raises(ConnectionError):
        host.read_scored("alice", _tea(hash_embedder))
    assert host._scored_call == call  # the next read calls the function again


def test_a_function_of_that_name_that_is_not_pbrs_is_never_called(
    pgvector_engine: Any, hash_embedder: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Someone else's function under the name pbr would give its own (the name is a digest
    anyone can compute) is not called: its code must be pbr's, with the caller's rights."""
    engine = pgvector_engine[0]
    _six_shared(engine, hash_embedder)
    first, _ = _scored_read(engine, hash_embedder)
    sql = engine_sql(engine)
    ((name, args, result),) = sql([(_FUNCTION_OF_NOTES, {})])
    sql([(f"DROP FUNCTION {name}({args})", {}), (_impostor(name, args, result), {})])
    with caplog.at_level(logging.WARNING, logger="pbr"):
        got, host = _scored_read(engine, hash_embedder)
    assert host._scored_call == "" and "is not the function pbr makes" in caplog.text
    assert got.keys == first.keys and got.state == first.state


def test_an_overload_another_role_adds_is_never_called_instead(
    pgvector_engine: Any, hash_embedder: Any
) -> None:
    """Each argument of the call is cast to its type: a function of the same name whose
    arguments would fit the untyped call better is not chosen."""
    engine = pgvector_engine[0]
    _six_shared(engine, hash_embedder)
    first, _ = _scored_read(engine, hash_embedder)
    sql = engine_sql(engine)
    ((name, args, result),) = sql([(_FUNCTION_OF_NOTES, {})])
    overload = args.replace("bigint", "smallint")
    assert overload != args
    sql([(_impostor(name, overload, result), {})])
    got, host = _scored_read(engine, hash_embedder)
    assert host._scored_call and got.keys == first.keys and got.state == first.state


def test_pbrs_function_made_by_another_role_is_not_called(
    pgvector_engine: Any, hash_embedder: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Even with pbr's very code, a function owned by a role the reader is not (nor the
    table's owner) is not called: its owner could replace it at any time."""
    engine = pgvector_engine[0]
    _six_shared(engine, hash_embedder)
    sql = engine_sql(engine)
    ((name, args, _),) = sql([(_FUNCTION_OF_NOTES, {})])
    ((definition,),) = sql([(f"SELECT pg_get_functiondef('{name}({args})'::regprocedure)", {})])
    sql([(f"DROP FUNCTION {name}({args})", {}), ("GRANT CREATE ON SCHEMA public TO PUBLIC", {})])
    grants = "SELECT ON notes, pbr_revisions, pbr_states"
    with _login_as(engine, "pbr_other", grants) as other:
        engine_sql(other)([(definition, {})])
        with _login_as(engine, "pbr_reader", grants) as reader:
            with caplog.at_level(logging.WARNING, logger="pbr"):
                got, host = _scored_read(reader, hash_embedder)
            assert host._scored_call == "" and "another role owns it" in caplog.text
            assert got.state is not None and len(got.keys) == 6


def test_a_role_that_may_not_create_functions_reads_by_the_statement(
    pgvector_engine: Any, hash_embedder: Any
) -> None:
    engine = pgvector_engine[0]
    _six_shared(engine, hash_embedder)
    sql = engine_sql(engine)
    sql([(f"DROP FUNCTION {name}", {}) for name in _scored_functions(engine)])
    sql([("REVOKE CREATE ON SCHEMA public FROM PUBLIC", {})])
    with _login_as(engine, "pbr_reader", "SELECT ON notes, pbr_revisions, pbr_states") as reader:
        got, host = _scored_read(reader, hash_embedder)
        assert host._scored_call == "" and got.state is not None and len(got.keys) == 6
    assert _scored_functions(engine) == []


def test_a_row_without_a_key_is_read_not_ranked_from_the_state(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row whose key is NULL (a key column that allows it) is never lined up with a state's
    item: the cold request reads the rows and answers as the first worker did."""
    engine = pgvector_engine[0]
    _notes_by_hand(engine, hash_embedder, [str(i) for i in range(1, 12)] + [None])
    first = _personalizer(engine, hash_embedder, fusion="no_prf").search("alice", "tea", 3)
    views, reads = _counting_views(monkeypatch), _counting_reads(monkeypatch)
    got = _personalizer(engine, hash_embedder, fusion="no_prf").search("alice", "tea", 3)
    assert views == ["alice"] and reads == ["MainThread"]  # tried, then the rows read
    assert _answer(got) == _answer(first)


@pytest.fixture
def win1252_engine(pgvector_url: str) -> Iterator[Any]:
    """A database in WIN1252 with the C collation (which sorts its bytes, not code points)."""
    import psycopg
    from sqlalchemy import create_engine

    name = f"pbr_win_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pgvector_url, autocommit=True) as conn:
        conn.execute(
            f"CREATE DATABASE {name} ENCODING 'WIN1252' LC_COLLATE 'C' LC_CTYPE 'C' "
            "TEMPLATE template0"
        )
    url = pgvector_url.replace("/postgres?", f"/{name}?")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION vector")
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    yield engine
    engine.dispose()
    with psycopg.connect(pgvector_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


def test_a_database_in_another_encoding_ranks_in_the_database_too(
    win1252_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys are put in code-point order by both reads whatever the server's encoding (in
    WIN1252, "C" puts "€" before "Ž" and "ÿ"; code points the other way round)."""
    _notes_by_hand(win1252_engine, hash_embedder, ["a", "b", "ÿ", "Ž", "€", "c"])
    first = _personalizer(win1252_engine, hash_embedder, fusion="no_prf").search("alice", "tea", 3)
    views, reads = _counting_views(monkeypatch), _counting_reads(monkeypatch)
    got = _personalizer(win1252_engine, hash_embedder, fusion="no_prf").search("alice", "tea", 3)
    assert views == ["alice"] and "MainThread" not in reads  # ranked in the database
    assert _answer(got) == _answer(first)


def test_a_write_the_trigger_did_not_see_is_not_ranked_from_the_state(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state that ranks in the database is used only at the change token it was derived
    at, which holds the triggers' own catalog rows: a trigger disabled and enabled again around
    a write moves it, though the revision did not."""
    engine = pgvector_engine[0]
    writer = _many_shared(engine, hash_embedder)
    names = writer.host._trigger_names()  # type: ignore[union-attr]
    engine_sql(engine)(
        [
            ("ALTER TABLE notes DISABLE TRIGGER USER", {}),
            ("UPDATE notes SET doc = 'alice rides trains' WHERE meta ->> 'pbr_id' = 'm03'", {}),
            (
                "ALTER TABLE notes ENABLE ALWAYS TRIGGER {rev}, "
                "ENABLE ALWAYS TRIGGER {trunc}".format(**names),
                {},
            ),
        ]
    )
    views, reads = _counting_views(monkeypatch), _counting_reads(monkeypatch)
    got = _personalizer(engine, hash_embedder, fusion="no_prf").search("alice", "rides", 1)
    assert views == ["alice"] and reads == ["MainThread"]
    assert [h.text for h in got.hits] == ["alice rides trains"]


def _reads_history(inputs: FusionInputs) -> FusionResult:
    """A fusion rule that reads the user's vectors (q* stays in the span of q and the anchor)."""
    assert inputs.history.vectors.shape[0] == len(inputs.history)
    return default_rule(inputs)


def test_a_custom_fusion_rule_gets_the_users_history_in_memory(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rule of the caller's may read anything a snapshot has: the view does not stand in for
    one there; the request reads the user's rows and answers as a warm worker does."""
    engine = pgvector_engine[0]
    _many_shared(engine, hash_embedder)

    def worker() -> Personalizer:
        corpus = _worker(engine, hash_embedder)
        config = PBRConfig(fusion="no_prf")
        return Personalizer(corpus=corpus, config=config, fusion_rule=_reads_history)

    warm = worker()
    warm.corpus.history("alice")
    views, reads = _counting_views(monkeypatch), _counting_reads(monkeypatch)
    assert _answer(worker().search("alice", "tea", 5)) == _answer(warm.search("alice", "tea", 5))
    assert views == ["alice"] and reads == ["MainThread"]


def test_a_worker_whose_embedder_reads_less_text_does_not_rank_from_the_state(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Which items have windows (and score as their best window) depends on how much text the
    embedder reads: a worker that reads less than the one that shared the state reads the rows."""
    engine = pgvector_engine[0]
    _many_shared(engine, hash_embedder)  # shared by a worker whose embedder reads any length
    short = Window(max_tokens=3, count=lambda text: len(text.split()))
    monkeypatch.setattr(Corpus, "_window", lambda self: short)
    views, reads = _counting_views(monkeypatch), _counting_reads(monkeypatch)
    _personalizer(engine, hash_embedder, fusion="no_prf").search("alice", "tea", 5)
    assert views == ["alice"] and reads == ["MainThread"]


def test_a_row_rewritten_where_the_token_did_not_move_is_not_ranked_from_the_state(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state is used only for rows of exactly the versions it was derived from (a
    partition's own trigger disabled around a write leaves the parent's token as it was; here
    the row version the statement reads is changed)."""
    engine = pgvector_engine[0]
    _many_shared(engine, hash_embedder)
    real = PgRecords.read_scored

    def rewritten(self: PgRecords, user_id: str, q: Any) -> Any:
        rows = real(self, user_id, q)
        return dataclasses.replace(rows, stamps=["1", *rows.stamps[1:]])

    monkeypatch.setattr(PgRecords, "read_scored", rewritten)
    views, reads = _counting_views(monkeypatch), _counting_reads(monkeypatch)
    _personalizer(engine, hash_embedder, fusion="no_prf").search("alice", "tea", 5)
    assert views == ["alice"] and reads == ["MainThread"]


def test_a_query_vector_of_another_dimension_is_refused_clearly_by_a_cold_worker(
    pgvector_engine: Any, hash_embedder: Any
) -> None:
    engine = pgvector_engine[0]
    _many_shared(engine, hash_embedder)
    cold = _personalizer(engine, hash_embedder, fusion="no_prf")
    with pytest.raises(EmbeddingError, match="dimension 8"):
        cold.search("alice", "tea", 5, query_vector=[0.1] * 8)


class _Down:
    """An embedder whose service is down (its calls counted)."""

    def __init__(self) -> None:
        self.calls = 0

    def embed_query(self, text: str) -> list[float]:
        self.calls += 1
        raise ConnectionError("embedding service down")

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        raise ConnectionError("embedding service down")


def test_an_empty_memory_costs_no_embedding_and_an_embedder_failure_is_the_usual_one(
    pgvector_engine: Any, hash_embedder: Any
) -> None:
    """Agent memory (skip_unknown): a user without items gets nothing, without an embedding,
    as over any store. A plain request of a user who has rows, the embedder down: the error
    the usual path raises, not one of the attempt to rank in the database."""
    engine = pgvector_engine[0]
    _many_shared(engine, hash_embedder)
    embedder = _Down()
    down = Personalizer(corpus=_worker(engine, embedder), config=PBRConfig(fusion="no_prf"))
    request = Request("nobody", "tea", 5, config=down.config, skip_unknown=True)
    got = retrieve(down.corpus, request, down.personalize)
    assert (got.query, got.results, embedder.calls) == (None, [], 0)
    with pytest.raises(Exception, match="embedding service down"):
        down.search("alice", "tea", 5)
    assert embedder.calls == 1  # one call of a failing service, not a retry


def test_personalize_refuses_another_users_history(
    pgvector_engine: Any, hash_embedder: Any
) -> None:
    engine = pgvector_engine[0]
    writer = _many_written(engine, hash_embedder)
    _add(writer, "bob", {"b0": "bob secret"})
    personalizer = _personalizer(engine, hash_embedder, fusion="no_prf")
    bobs = personalizer.corpus.history("bob")
    with pytest.raises(ValueError, match="'bob'"):
        personalizer.personalize("alice", "tea", history=bobs)


def test_an_explanation_longer_than_a_state_keeps_is_not_tried_in_the_database(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A state keeps the anchor's ten most central items: a request that lists more is known
    not to be servable before anything is read (no statement wasted on it)."""
    engine = pgvector_engine[0]
    _many_shared(engine, hash_embedder)
    views, reads = _counting_views(monkeypatch), _counting_reads(monkeypatch)
    got = _personalizer(engine, hash_embedder, fusion="no_prf", top_anchor_items=20).search(
        "alice", "tea", 5
    )
    assert len(got.personalized.explanation.anchor_items) == 20
    assert views == [] and reads == ["MainThread"]


def test_a_key_column_that_is_not_unique_still_shares_a_state_cold_workers_take(
    pgvector_engine: Any, hash_embedder: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Two items under one key (outside what a view serves): the state is shared without the
    keys, and the next cold worker takes it without a warning."""
    engine = pgvector_engine[0]
    sql = engine_sql(engine)
    sql([("CREATE TABLE notes (id text, doc text, meta jsonb, emb vector(16))", {})])
    for i in range(12):
        text = f"alice note {i} about tea"
        meta = json.dumps({"user_id": "alice", "pbr_id": f"m{i}"})
        vector = json.dumps(hash_embedder.embed_query(text))
        sql(
            [
                (
                    "INSERT INTO notes VALUES (:id, :doc, CAST(:meta AS jsonb), "
                    "CAST(:emb AS vector))",
                    {
                        "id": "one-key" if i < 2 else f"k{i}",
                        "doc": text,
                        "meta": meta,
                        "emb": vector,
                    },
                )
            ]
        )
    _personalizer(engine, hash_embedder, fusion="no_prf").search("alice", "tea", 3)
    assert len(sql([("SELECT state FROM pbr_states", {})])) == 1
    with caplog.at_level(logging.WARNING, logger="pbr"):
        cold = _personalizer(engine, hash_embedder, fusion="no_prf")
        cold.corpus.rank_cold_in_database = False
        cold.search("alice", "tea", 3)
    assert not [r for r in caplog.records if "not usable" in r.getMessage()]


# -- a writer that shares the state its write removed (Corpus.derive_after_write) -------------
def _has_state(engine: Any, user: str) -> bool:
    sql = engine_sql(engine)
    return bool(sql([("SELECT count(*) FROM pbr_states WHERE owner = :u", {"u": user})])[0][0])


def _deriving_writer(engine: Any, embedder: Any) -> Corpus:
    """alice's many notes written and shared; the writer then derives after each write."""
    writer = _many_shared(engine, embedder)
    writer.derive_after_write = PBRConfig(fusion="no_prf")
    return writer


def test_a_writer_that_derives_after_writing_lets_a_new_worker_rank_in_the_database(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write removes the user's state; a writer with ``derive_after_write`` derives and
    shares it again in the background, so a worker new to the user ranks their next request
    in the database, with the answer a worker reading the rows gives."""
    engine = pgvector_engine[0]
    writer = _deriving_writer(engine, hash_embedder)
    _add(writer, "alice", {"m40": "alice green tea note 40 at 5 pm"})
    assert writer.join_background(10) and _has_state(engine, "alice")
    views, reads = _counting_views(monkeypatch), _counting_reads(monkeypatch)
    got = _personalizer(engine, hash_embedder, fusion="no_prf").search("alice", "green tea", 7)
    assert views == ["alice"] and "MainThread" not in reads  # ranked in the database
    assert "alice" not in writer.cache or len(writer.cache.get("alice")) == 41  # untouched
    monkeypatch.setattr(Corpus, "rank_cold_in_database", False)
    expected = _personalizer(engine, hash_embedder, fusion="no_prf").search("alice", "green tea", 7)
    assert _answer(got) == _answer(expected)
    writer.delete("alice", ["m40"])  # a delete is a write too
    assert writer.join_background(10) and _has_state(engine, "alice")
    asyncio.run(writer.aadd_many({"alice": [HistoryItem(id="m41", text="alice tea at 6 pm")]}))
    assert writer.join_background(10) and _has_state(engine, "alice")  # async writes too


def test_without_derive_after_write_a_write_leaves_no_state_behind(
    pgvector_engine: Any, hash_embedder: Any
) -> None:
    engine = pgvector_engine[0]
    writer = _many_shared(engine, hash_embedder)
    _add(writer, "alice", {"m40": "alice green tea note 40 at 5 pm"})
    assert writer.join_background(10) and not _has_state(engine, "alice")


@pytest.mark.parametrize(
    ("config", "why"),
    [
        ({"fusion": "safe"}, "not ranked in the database"),
        ({"fusion": "no_prf", "rerank": "salience"}, "not ranked in the database"),
        ({"fusion": "plain", "search": "dense"}, "derives nothing"),
    ],
)
def test_a_config_no_request_would_rank_from_a_state_is_refused_for_derivation(
    config: dict[str, Any], why: str
) -> None:
    corpus = Corpus(None)
    with pytest.raises(ValueError, match=why):
        corpus.derive_after_write = PBRConfig(**config)
    assert corpus.derive_after_write is None


def test_states_derived_ahead_let_users_loaded_by_sql_be_ranked_in_the_database(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows written without pbr have no shared state: ``derive_states`` derives and shares it
    (by a reader of its own: the deriving corpus's cache is untouched), so a worker new to the
    user ranks their first request in the database, with the answer a worker reading the rows
    gives; run again it writes nothing (the state is current); a user without rows is
    skipped."""
    engine = pgvector_engine[0]
    _notes_by_hand(engine, hash_embedder, [f"k{i:02d}" for i in range(12)])
    deriver = _worker(engine, hash_embedder)
    config = PBRConfig(fusion="no_prf")
    assert deriver.derive_states(config, iter(["alice", "nobody"])) == ["alice"]
    assert _has_state(engine, "alice") and "alice" not in deriver.cache
    views, reads = _counting_views(monkeypatch), _counting_reads(monkeypatch)
    got = _personalizer(engine, hash_embedder, fusion="no_prf").search("alice", "tea", 3)
    assert views == ["alice"] and "MainThread" not in reads  # ranked in the database
    monkeypatch.setattr(Corpus, "rank_cold_in_database", False)
    expected = _personalizer(engine, hash_embedder, fusion="no_prf").search("alice", "tea", 3)
    # the same answer; the scores equal to float32 rounding (the database's cosines)
    assert _answer(got)[1:] == _answer(expected)[1:]
    assert [(h.id, h.text, h.metadata) for h in got.hits] == [
        (h.id, h.text, h.metadata) for h in expected.hits
    ]
    for mine, theirs in zip(got.hits, expected.hits):
        assert mine.score == pytest.approx(theirs.score, abs=1e-5)
        assert mine.legs == pytest.approx(theirs.legs, abs=1e-5)
    assert deriver.derive_states(config, ["alice"]) == []  # already shared at these rows
    assert _has_state(engine, "alice")


def test_derive_states_refuses_what_no_request_would_use_and_a_host_without_states(
    pgvector_engine: Any, hash_embedder: Any
) -> None:
    engine = pgvector_engine[0]
    _notes_by_hand(engine, hash_embedder, ["k0", "k1"])
    worker = _worker(engine, hash_embedder)
    with pytest.raises(ValueError, match="not ranked in the database"):
        worker.derive_states(PBRConfig(fusion="safe"), ["alice"])
    with pytest.raises(TypeError, match="PBRConfig"):
        worker.derive_states({"fusion": "no_prf"}, ["alice"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="iterable of user ids"):
        worker.derive_states(PBRConfig(fusion="no_prf"), "alice")
    with pytest.raises(ValueError, match="keeps no shared derived states"):
        Corpus(None, embedder=hash_embedder).derive_states(PBRConfig(fusion="no_prf"), [])
    with pytest.raises(ValueError, match="non-empty string"):
        worker.derive_states(PBRConfig(fusion="no_prf"), [""])
    assert not _has_state(engine, "alice")


def test_derive_states_says_which_users_it_could_not_read(
    pgvector_engine: Any,
    hash_embedder: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A maintenance job sees what failed: a user the host cannot read is left out of the
    returned users with a warning, and the next user is still derived."""
    engine = pgvector_engine[0]
    _notes_by_hand(engine, hash_embedder, ["k0", "k1", "k2"])
    engine_sql(engine)(
        [
            (
                "INSERT INTO notes VALUES ('b1', 'bob likes trains', CAST(:meta AS jsonb), "
                "CAST(:emb AS vector))",
                {
                    "meta": json.dumps({"user_id": "bob", "pbr_id": "b1"}),
                    "emb": json.dumps(_floats(hash_embedder, "bob likes trains")),
                },
            )
        ]
    )
    worker = _worker(engine, hash_embedder)
    real = PgRecords.read_user

    def failing(self: PgRecords, user_id: str) -> Any:
        if user_id == "alice":
            raise ConnectionError("the server went away")
        return real(self, user_id)

    monkeypatch.setattr(PgRecords, "read_user", failing)
    with caplog.at_level(logging.WARNING, logger="pbr"):
        shared = worker.derive_states(PBRConfig(fusion="no_prf"), ["alice", "bob"])
    assert shared == ["bob"] and not _has_state(engine, "alice")
    assert any("not derived" in r.getMessage() for r in caplog.records)


def test_a_user_with_an_item_longer_than_the_embedder_reads_is_not_derived(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A state with windows never ranks in the database: the derivation gives up before
    embedding any window (it would embed them again on every write)."""
    engine = pgvector_engine[0]
    short = Window(max_tokens=3, count=lambda text: len(text.split()))
    monkeypatch.setattr(Corpus, "_window", lambda self: short)
    embedded: list[str] = []
    real = pbr_core.corpus.embed_documents

    def counted(*args: Any, **kwargs: Any) -> Any:
        embedded.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(pbr_core.corpus, "embed_documents", counted)
    writer, _ = _corpus(_records(engine), hash_embedder)
    writer.derive_after_write = PBRConfig(fusion="no_prf")
    _add(writer, "alice", {"long": "alice drinks green tea at night", "short": "alice trains"})
    assert writer.join_background(10)
    assert "MainThread" in embedded and "pbr-read-later" not in embedded
    assert not _has_state(engine, "alice")


def test_a_derivation_that_fails_after_a_write_leaves_the_write_and_the_next_read_as_they_are(
    pgvector_engine: Any, hash_embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The derivation is a cache fill: its failure (here every cold read fails in the
    background) neither fails the write nor leaves a state; the next worker reads the rows."""
    engine = pgvector_engine[0]
    writer = _deriving_writer(engine, hash_embedder)
    real = PgRecords.read_user
    failed = threading.Event()

    def broken(self: PgRecords, user_id: str) -> Any:
        if threading.current_thread().name == "pbr-read-later":
            failed.set()
            raise ConnectionError("the database went away")
        return real(self, user_id)

    monkeypatch.setattr(PgRecords, "read_user", broken)
    _add(writer, "alice", {"m40": "alice green tea note 40 at 5 pm"})
    assert writer.join_background(10) and failed.is_set()
    assert not _has_state(engine, "alice")
    got = _personalizer(engine, hash_embedder, fusion="no_prf").search("alice", "note 40", 3)
    assert "m40" in {h.id for h in got.hits}


def test_a_row_rewritten_between_the_listing_and_its_vectors_read_is_listed_again(
    pgvector_engine: tuple[Any, Any], hash_embedder: Any
) -> None:
    """A warm worker lists a user's changed rows without vectors, then reads the vectors: a row
    another process rewrote between the two statements gave the cache the listed (old) text
    with the new vector, an item that never existed, served by that request (from a review)."""
    engine = pgvector_engine[0]
    host = _records(engine)
    corpus = Corpus(host, embedder=hash_embedder)
    _add(corpus, "alice", {f"n{i}": f"alice note number {i}" for i in range(6)})
    corpus.history("alice")  # warm
    sql = engine_sql(engine)
    key = pbr_core.corpus.scoped_key("alice", "n3")

    def rewrite(text: str) -> None:
        vector = np.asarray(hash_embedder.embed_documents([text])[0], dtype=np.float64)
        sql(
            [
                (
                    "UPDATE notes SET doc = :doc, emb = CAST(:emb AS vector) WHERE id = :id",
                    {"id": key, "doc": text, "emb": json.dumps(vector.tolist())},
                )
            ]
        )

    rewrite("version two: apples")
    fetch, fetched = host.fetch, []

    def fetch_after_a_write(user_id: str, keys: Sequence[str]) -> list[Record]:
        if not fetched:  # another process writes between the listing and the first fetch
            rewrite("version three: bananas")
        fetched.append(list(keys))
        return fetch(user_id, keys)

    host.fetch = fetch_after_a_write  # type: ignore[method-assign]
    history = corpus.history("alice")
    assert history is not None and len(fetched) == 2  # listed again after the move
    item = history.items[history.position("n3")]
    expected = np.asarray(hash_embedder.embed_documents(["version three: bananas"])[0])
    assert item.text == "version three: bananas"
    np.testing.assert_allclose(
        history.vectors[history.position("n3")], expected / np.linalg.norm(expected), atol=1e-6
    )


def test_a_rewrite_of_the_table_or_a_child_tables_rows_reach_a_warm_worker(
    pgvector_engine: tuple[Any, Any], hash_embedder: Any
) -> None:
    """Writes no row trigger of the table fires for left the change token as it was, so a
    warm worker served its cache until the user's rows were written again (from a review): a
    rewrite of every row (ALTER TABLE ... USING) gives the table a new file, which the token
    now holds; a child table that is not a partition (INHERITS) leaves the table no token."""
    engine = pgvector_engine[0]
    host = _records(engine)
    warm = Corpus(host, embedder=hash_embedder)
    _add(warm, "alice", {f"n{i}": f"alice note {i}" for i in range(3)})
    warm.history("alice")
    sql = engine_sql(engine)
    sql([("ALTER TABLE notes ALTER COLUMN doc TYPE text USING upper(doc)", {})])
    assert sorted(it.text for it in warm.history("alice").items) == [
        "ALICE NOTE 0",
        "ALICE NOTE 1",
        "ALICE NOTE 2",
    ]
    vector = np.asarray(hash_embedder.embed_documents(["child row"])[0], dtype=np.float64)
    sql(
        [
            ("CREATE TABLE notes_child () INHERITS (notes)", {}),
            (
                "INSERT INTO notes_child VALUES (:id, 'child row', CAST(:m AS jsonb), "
                "CAST(:e AS vector))",
                {
                    "id": pbr_core.corpus.scoped_key("alice", "c1"),
                    "m": json.dumps({"user_id": "alice", "pbr_id": "c1"}),
                    "e": json.dumps(vector.tolist()),
                },
            ),
        ]
    )
    assert host.change_token("alice") is None
    assert sorted(it.id for it in warm.history("alice").items) == ["c1", "n0", "n1", "n2"]


@pytest.mark.parametrize("scale", [1e-25, 1e20])
def test_a_row_whose_vector_the_database_cannot_rank_is_ranked_from_the_rows(
    pgvector_engine: tuple[Any, Any], hash_embedder: Any, scale: float
) -> None:
    """A row written by SQL with a finite vector of tiny or huge norm: reading the rows
    rescales it exactly, but pgvector's cosine, summed in float32, came out as ±1 or 0, so a
    worker new to the user ranked another top k in the database (from a review)."""
    engine = pgvector_engine[0]
    _table(engine)
    texts = {
        f"n{i:02d}": f"note {i} about {'tea' if i % 2 else 'trains'} {i % 5}" for i in range(20)
    }
    rows = []
    for item, text in texts.items():
        vector = np.asarray(hash_embedder.embed_documents([text])[0], dtype=np.float64)
        vector = vector / np.linalg.norm(vector) * (scale if item in ("n07", "n08") else 1.0)
        rows.append(
            (
                "INSERT INTO notes VALUES (:id, :doc, CAST(:meta AS jsonb), CAST(:emb AS vector))",
                {
                    "id": pbr_core.corpus.scoped_key("alice", item),
                    "doc": text,
                    "meta": json.dumps({"user_id": "alice", "pbr_id": item}),
                    "emb": json.dumps([float(np.float32(x)) for x in vector]),
                },
            )
        )
    engine_sql(engine)(rows)

    def worker() -> Personalizer:
        host = PgRecords(
            PgTable("public", "notes", "id", "doc", "meta", "emb"),
            engine_sql(engine),
            "user_id",
            lambda records: None,
        )
        return Personalizer(
            corpus=Corpus(host, embedder=hash_embedder), config=PBRConfig(fusion="no_prf")
        )

    def top(p: Personalizer) -> list[tuple[str, float]]:
        return [(h.id, round(h.score, 4)) for h in p.search("alice", "something about tea", 5).hits]

    first = worker()
    top(first)  # reads the rows and shares the user's state
    first.corpus.share_state("alice")
    assert top(worker()) == top(first)


def test_a_partitioned_tables_rewrites_truncates_and_detaches_reach_a_warm_worker(
    pgvector_engine: Any, hash_embedder: Any
) -> None:
    """A partitioned table has no file of its own: its token now holds its leaf partitions'
    files, so a rewrite of every partition, a TRUNCATE of one, and a partition detached (none
    fires a row trigger) move it (a rewrite left a warm worker serving old texts; from a
    review of the file in the token)."""
    sql = engine_sql(pgvector_engine[0])
    sql(
        [
            (
                f"CREATE TABLE notes (id text PRIMARY KEY, doc text, meta jsonb, "
                f"emb vector({DIM})) PARTITION BY HASH (id)",
                {},
            ),
            *(
                (
                    f"CREATE TABLE notes_{r} PARTITION OF notes FOR VALUES WITH "
                    f"(MODULUS 2, REMAINDER {r})",
                    {},
                )
                for r in (0, 1)
            ),
        ]
    )
    table = PgTable("public", "notes", "id", "doc", "meta", "emb")
    corpus, _ = _corpus(PgRecords(table, sql, "user_id", _writer(table, sql)), hash_embedder)
    _add(corpus, "alice", {f"n{i}": f"alice note {i}" for i in range(6)})
    assert corpus.host.change_token("alice") is not None  # type: ignore[union-attr]
    sql([("ALTER TABLE notes ALTER COLUMN doc TYPE text USING upper(doc)", {})])
    assert {it.text for it in corpus.history("alice").items} == {
        f"ALICE NOTE {i}" for i in range(6)
    }
    sql([("TRUNCATE notes_0", {})])
    after_truncate = _ids(corpus, "alice")
    assert 0 < len(after_truncate) < 6
    sql([("ALTER TABLE notes DETACH PARTITION notes_1", {})])
    assert _ids(corpus, "alice") == []
