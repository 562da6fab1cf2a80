"""PostgreSQL (pgvector) tables as host stores: the SQL both adapters run, written once.

LangChain's ``langchain_postgres.PGVector`` and LlamaIndex's ``PGVectorStore`` keep one row per
record in a table with a key column, a text column, a JSON(B) metadata column and a pgvector
column. :class:`PgRecords` is the :class:`~pbr_core.corpus.HostRecords` of such a table: the
adapters say where the columns are (:class:`PgTable`), how to run SQL in one transaction
(:data:`Sql`, no driver or framework here) and how their framework writes a row; everything else
is here:

* **Listing by owner through an index.** A user's rows are ``metadata ->> user_key = user``;
  neither framework indexes that expression (LangChain has a GIN index for ``@>`` filters,
  LlamaIndex indexes ``ref_doc_id`` only), so :meth:`PgRecords.setup` creates a btree index on
  it (``CREATE INDEX IF NOT EXISTS``, named ``pbr_owner_*``). A listing is then an index scan of
  the user's rows, whatever the table's size.
* **Vectors read back** in pgvector's binary form (``vector_send``; the text form
  ``[0.1,0.2,...]`` for a ``halfvec`` column), parsed here: no driver type registration needed.
* **Cheap verification.** :meth:`PgRecords.setup` installs a row trigger (``pbr_rev_*``) that
  stamps ``pbr_revisions(tbl, user_key, owner)`` with a fresh value of the sequence
  ``pbr_revision_seq`` on every insert, update or delete of an owner's row, whoever makes it (the
  framework, pbr, plain SQL; ``TRUNCATE`` stamps every owner of the table).
  :meth:`PgRecords.change_token` reads that one row by primary key; :class:`~pbr_core.corpus.Corpus`
  lists the user again only when it changed. The stamp is written in the writer's transaction,
  so it becomes visible together with the rows; a sequence never repeats a value, so a token
  seen once cannot come back after other changes. Where the role may not create the trigger (no
  ``CREATE`` / ownership of the table), the token is None and every read lists, as for Chroma.
* **Ownership in SQL too.** Deletes and reads name the owner in their ``WHERE`` clause
  (defence in depth behind :func:`~pbr_core.corpus.scoped_key`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .corpus import Record

__all__ = [
    "PgRecords",
    "PgTable",
    "Sql",
    "UserRows",
    "async_engine_sql",
    "engine_sql",
    "parse_vector",
    "parse_vectors",
    "quote_ident",
    "quote_literal",
]

log = logging.getLogger("pbr.postgres")

#: Runs ``(statement, parameters)`` pairs in one transaction (``:name`` placeholders, lists
#: bound as arrays) and returns the last statement's rows (empty for one without rows).
Sql = Callable[[Sequence[tuple[str, Mapping[str, Any]]]], list[tuple[Any, ...]]]

_LOCK = 7_211_645_123_004_931  # pg_advisory_xact_lock key: one setup at a time per database


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    if not name or "\x00" in name:
        raise ValueError(f"not a SQL identifier: {name!r}")
    return '"' + name.replace('"', '""') + '"'


def quote_literal(value: str) -> str:
    """``value`` as a SQL string literal (standard_conforming_strings, the default since 9.1).
    Used for the metadata key in ``metadata ->> 'key'``, which must be a literal for the
    planner to match the owner index."""
    if "\x00" in value:
        raise ValueError(f"a NUL character cannot be in a SQL literal: {value!r}")
    return "'" + value.replace("'", "''") + "'"


def parse_vector(text: Any) -> np.ndarray | None:
    """pgvector's text form (``[1,2,3]``) or binary form (``vector_send``: dimension, a zero,
    big-endian float32s) as a float32 array; None for NULL."""
    if text is None:
        return None
    if isinstance(text, (bytes, bytearray, memoryview)):
        data = bytes(text)
        (dim,) = struct.unpack_from(">H", data)
        return np.frombuffer(data, dtype=">f4", count=dim, offset=4).astype(np.float32)
    if not isinstance(text, str):  # a driver with pgvector's type registered
        return np.asarray(text, dtype=np.float32)
    return np.array(json.loads(text), dtype=np.float32)


def parse_vectors(data: Any, n: int) -> list[np.ndarray | None]:
    """``n`` vectors of pgvector's binary form concatenated (``string_agg(vector_send(v))``,
    a NULL vector as a zero dimension), as float32 arrays (None for NULL)."""
    if n == 0:
        return []
    raw = bytes(data or b"")
    if len(raw) >= 4:
        (dim,) = struct.unpack_from(">H", raw)
        width = 4 + 4 * dim
        if dim and len(raw) == n * width:  # the usual case: one dimension, no NULL
            rows = np.frombuffer(raw, dtype=np.uint8).reshape(n, width)
            heads = rows[:, :2].view(">u2").reshape(n)
            if (heads == dim).all():
                block = rows[:, 4:].copy().view(">f4")
                return list(block.astype(np.float32))
    out: list[np.ndarray | None] = []
    offset = 0
    for _ in range(n):
        if offset + 4 > len(raw):
            raise ValueError(f"vectors cut short: {len(out)} of {n} read")
        (dim,) = struct.unpack_from(">H", raw, offset)
        end = offset + 4 + 4 * dim
        if end > len(raw):
            raise ValueError(f"vectors cut short: {len(out)} of {n} read")
        vector = np.frombuffer(raw, dtype=">f4", count=dim, offset=offset + 4)
        out.append(vector.astype(np.float32) if dim else None)
        offset = end
    if offset != len(raw):
        raise ValueError(f"{len(raw) - offset} bytes after the {n} vectors")
    return out


@dataclass(frozen=True)
class UserRows:
    """What :meth:`PgRecords.read_user` read in one statement.

    Attributes:
        token: the change token of these rows (:meth:`PgRecords.change_token`), None where it
            cannot be told.
        records: every record of the user, with vectors, in key order.
        state: ``(token it was derived at, blob)`` of the user's shared derived state, or None.
    """

    token: str | None
    records: list[Record]
    state: tuple[str, bytes] | None


@dataclass(frozen=True)
class PgTable:
    """Where a framework keeps its rows.

    Attributes:
        schema: the table's schema (``public``).
        name: the table.
        key: the column of the record's key (the store's id of a row).
        text: the column of the text.
        metadata: the JSON or JSONB column of the metadata.
        vector: the pgvector column.
        scope_column: a column that must equal ``scope`` for a row to be this store's (LangChain's
            ``collection_id``: one table holds every collection); None: the whole table.
        scope: the value of ``scope_column``.
        newest: a column ordering several rows of one key, newest last (LlamaIndex's ``id``:
            its key column is not unique); None where the key is unique.
    """

    schema: str
    name: str
    key: str
    text: str
    metadata: str
    vector: str
    scope_column: str | None = None
    scope: Any = None
    newest: str | None = None

    @property
    def qualified(self) -> str:
        return f"{quote_ident(self.schema)}.{quote_ident(self.name)}"

    @property
    def regclass(self) -> str:
        """The table as ``to_regclass`` reads it."""
        return self.qualified

    def owner_expr(self, user_key: str) -> str:
        return f"({quote_ident(self.metadata)} ->> {quote_literal(user_key)})"

    def scoped(self) -> str:
        """The ``WHERE`` condition of this store's rows (``TRUE`` for a whole table)."""
        if self.scope_column is None:
            return "TRUE"
        return f"{quote_ident(self.scope_column)} = :pbr_scope"

    def params(self, **more: Any) -> dict[str, Any]:
        out = dict(more)
        if self.scope_column is not None:
            out["pbr_scope"] = self.scope
        return out

    def suffix(self, user_key: str) -> str:
        """A short stable name part for pbr's index and trigger on this table and key."""
        raw = json.dumps([self.schema, self.name, self.metadata, self.scope_column, user_key])
        return hashlib.blake2b(raw.encode(), digest_size=6).hexdigest()


_FUNCTIONS = r"""
CREATE TABLE IF NOT EXISTS pbr_revisions (
    tbl oid NOT NULL, user_key text NOT NULL, owner text NOT NULL, rev bigint NOT NULL,
    PRIMARY KEY (tbl, user_key, owner));
CREATE SEQUENCE IF NOT EXISTS pbr_revision_seq;
CREATE TABLE IF NOT EXISTS pbr_states (
    tbl oid NOT NULL, reader text NOT NULL, owner text NOT NULL, rev bigint NOT NULL,
    state bytea NOT NULL, PRIMARY KEY (tbl, reader, owner));
ALTER TABLE pbr_states ALTER COLUMN state SET STORAGE EXTERNAL;
CREATE OR REPLACE FUNCTION pbr_bump_revision() RETURNS trigger LANGUAGE plpgsql AS $pbr$
DECLARE
    who text;
BEGIN
    IF TG_OP <> 'INSERT' THEN
        EXECUTE format('SELECT ($1).%I ->> %L', TG_ARGV[1], TG_ARGV[0]) INTO who USING OLD;
        IF who IS NOT NULL THEN
            INSERT INTO pbr_revisions VALUES (TG_RELID, TG_ARGV[0], who,
                nextval('pbr_revision_seq'))
            ON CONFLICT ON CONSTRAINT pbr_revisions_pkey DO UPDATE SET rev = EXCLUDED.rev;
        END IF;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        EXECUTE format('SELECT ($1).%I ->> %L', TG_ARGV[1], TG_ARGV[0]) INTO who USING NEW;
        IF who IS NOT NULL THEN
            INSERT INTO pbr_revisions VALUES (TG_RELID, TG_ARGV[0], who,
                nextval('pbr_revision_seq'))
            ON CONFLICT ON CONSTRAINT pbr_revisions_pkey DO UPDATE SET rev = EXCLUDED.rev;
        END IF;
    END IF;
    RETURN NULL;
END $pbr$;
CREATE OR REPLACE FUNCTION pbr_truncate_revision() RETURNS trigger LANGUAGE plpgsql AS $pbr$
BEGIN
    UPDATE pbr_revisions SET rev = nextval('pbr_revision_seq') WHERE tbl = TG_RELID;
    RETURN NULL;
END $pbr$;
"""


class PgRecords:
    """:class:`~pbr_core.corpus.HostRecords` of one PostgreSQL table (see the module doc).

    Args:
        table: where the columns are.
        sql: runs statements in one transaction (the adapter's, over its store's engine).
        user_key: the metadata key naming a row's owner.
        write: writes records as the framework writes rows (its own row format), replacing rows
            of the same key; the adapter's.
        read_metadata: ``(key, stored metadata, text)`` -> the record's metadata, where the
            framework stores more than the user's metadata (LlamaIndex's ``_node_content``);
            None: the stored metadata as it is.
        owner: a per-user table (a partition): every row is this user's, tagged or not.
        setup: create the owner index and the revision trigger now (:meth:`setup`).
    """

    can_list = True

    def __init__(
        self,
        table: PgTable,
        sql: Sql,
        user_key: str,
        write: Callable[[Sequence[Record]], None],
        *,
        read_metadata: Callable[[str, dict[str, Any], str], dict[str, Any]] | None = None,
        owner: str | None = None,
        setup: bool = True,
    ) -> None:
        self.table = table
        self.sql = sql
        self.user_key = user_key
        self._write = write
        self._read_metadata = read_metadata
        self.owner = owner
        self.tokens = False  # whether change_token reads the trigger's revisions
        self._vector_sql: str | None = None  # how a read selects the vector (_vector_select)
        if setup:
            self.setup()

    # -- setup ---------------------------------------------------------------------------------
    def setup(self) -> None:
        """Create the owner index and the revision trigger (idempotent; under an advisory lock,
        so two workers starting at once do not race). A role that may not create them gets a
        warning, and verification lists every read."""
        t, key = self.table, self.user_key
        suffix = t.suffix(key)
        if self._installed():  # the usual case: no DDL, no lock on the table
            self.tokens = True
            return
        owner = t.owner_expr(key)
        scope = f"{quote_ident(t.scope_column)}, " if t.scope_column else ""
        meta = quote_ident(t.metadata)
        statements: list[tuple[str, Mapping[str, Any]]] = [
            (f"SELECT pg_advisory_xact_lock({_LOCK})", {}),
            (
                f"CREATE INDEX IF NOT EXISTS pbr_owner_{suffix} ON {t.qualified} ({scope}{owner})",
                {},
            ),
            (_FUNCTIONS, {}),
            (
                f"CREATE OR REPLACE TRIGGER pbr_rev_{suffix} AFTER INSERT OR UPDATE OR DELETE "
                f"ON {t.qualified} FOR EACH ROW EXECUTE FUNCTION pbr_bump_revision("
                f"{quote_literal(key)}, {quote_literal(t.metadata)})",
                {},
            ),
            (
                f"CREATE OR REPLACE TRIGGER pbr_trunc_{suffix} AFTER TRUNCATE ON {t.qualified} "
                "FOR EACH STATEMENT EXECUTE FUNCTION pbr_truncate_revision()",
                {},
            ),
            # Owners whose rows were written before the trigger existed get a first stamp.
            (
                "INSERT INTO pbr_revisions SELECT to_regclass(:tbl), :key, o, "
                f"nextval('pbr_revision_seq') FROM (SELECT DISTINCT {meta} ->> "
                f"{quote_literal(key)} AS o FROM {t.qualified}) owners WHERE o IS NOT NULL "
                "ON CONFLICT DO NOTHING",
                {"tbl": t.regclass, "key": key},
            ),
        ]
        try:
            self.sql(statements)
        except Exception as exc:  # a read-only role: still correct, listing on every read
            log.warning(
                "pbr: could not create the owner index / revision trigger on %s (%s); every "
                "query lists the user's rows instead",
                t.qualified,
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            )
            return
        self.tokens = True

    def _installed(self) -> bool:
        try:
            rows = self.sql(
                [
                    (
                        "SELECT count(*) + (to_regclass('pbr_states') IS NOT NULL)::int "
                        "FROM pg_trigger WHERE tgrelid = to_regclass(:tbl) "
                        "AND tgname IN (:rev, :trunc)",
                        {"tbl": self.table.regclass, **self._trigger_names()},
                    )
                ]
            )
        except Exception:
            return False
        return bool(rows) and rows[0][0] == 3

    # -- HostRecords ---------------------------------------------------------------------------
    def validate(self, records: Sequence[Record]) -> None:
        """PostgreSQL text and JSON cannot hold a NUL character."""
        for r in records:
            if "\x00" in r.text or "\\u0000" in json.dumps(dict(r.metadata), default=str):
                raise ValueError(
                    f"item {r.item_id!r} of user {r.user_id!r}: PostgreSQL cannot store a NUL "
                    "character (\\x00) in text or metadata; remove it"
                )
            if "\x00" in r.key:
                raise ValueError(f"record key {r.key!r} holds a NUL character")
        t = self.table
        if t.scope_column is None or t.newest is not None or not records:
            return
        # One key column for the whole table (LangChain's collections share it): a key held by
        # another scope would be "updated" there, not written here.
        taken = self.sql(
            [
                (
                    f"SELECT {quote_ident(t.key)} FROM {t.qualified} WHERE "
                    f"{quote_ident(t.key)} = ANY(:keys) AND NOT ({t.scoped()})",
                    t.params(keys=[r.key for r in records]),
                )
            ]
        )
        if taken:
            raise ValueError(
                f"{len(taken)} record key(s) (e.g. {taken[0][0]!r}) are held by another "
                f"{t.scope_column} of table {t.name!r}, which shares one key column: the same "
                "user and item id live in two collections. Use another user_key value (e.g. "
                "prefix the user id with the collection) or one collection"
            )

    def upsert(self, records: Sequence[Record]) -> None:
        if records:
            self._write(records)

    def delete(self, user_id: str, keys: Sequence[str]) -> None:
        if not keys:
            return
        t = self.table
        self.sql(
            [
                (
                    f"DELETE FROM {t.qualified} WHERE {t.scoped()} AND "
                    f"{quote_ident(t.key)} = ANY(:keys) AND {self._mine()}",
                    t.params(keys=list(keys), user=user_id),
                )
            ]
        )

    def list_user(self, user_id: str) -> list[Record]:
        return self._read(user_id, None, vectors=False)

    def fetch(self, user_id: str, keys: Sequence[str]) -> list[Record]:
        return self._read(user_id, list(keys), vectors=True) if keys else []

    def change_token(self, user_id: str) -> str | None:
        """A value that changes whenever any row of ``user_id`` in this table changes (one
        primary-key read); None where it cannot be told: no trigger (a read-only role), a
        per-user table, or a trigger that is gone or disabled since (a table dropped and
        created again, ``ALTER TABLE ... DISABLE TRIGGER``), checked in the same statement."""
        if not self.tokens or self.owner is not None:
            return None
        rows = self.sql(
            [
                (
                    "SELECT (SELECT rev FROM pbr_revisions WHERE tbl = to_regclass(:tbl) "
                    "AND user_key = :key AND owner = :user), (SELECT count(*) FROM pg_trigger "
                    "WHERE tgrelid = to_regclass(:tbl) AND tgname IN (:rev, :trunc) "
                    "AND tgenabled <> 'D')",
                    {
                        "tbl": self.table.regclass,
                        "key": self.user_key,
                        "user": user_id,
                        **self._trigger_names(),
                    },
                )
            ]
        )
        rev, armed = rows[0]
        if armed != 2:
            return None
        return "none" if rev is None else str(rev)

    def read_user(self, user_id: str) -> UserRows | None:
        """Every row of ``user_id`` with its vector, the change token and the user's shared
        derived state (:mod:`pbr_core.derived`), in **one statement**: one round trip, one
        snapshot of the database, so the token is exactly the rows' (a write committed
        meanwhile is either in both or in neither). Rows come in key order, so every worker
        that reads a user cold builds the same item order. What a worker that has never seen
        the user reads (:meth:`~pbr_core.corpus.Corpus.history`); None where this table cannot
        (no revision trigger, a per-user table, a vector column that is not ``vector``): the
        caller lists instead."""
        if not self.tokens or self.owner is not None:
            return None
        vector = self._vector_select()
        if not vector.endswith(".vector_send(" + quote_ident(self.table.vector) + ")"):
            return None
        t = self.table
        k = quote_ident(t.key)
        distinct, order = "", ""
        if t.newest is not None:
            distinct = f"DISTINCT ON ({k}) "
            order = f" ORDER BY {k}, {quote_ident(t.newest)} DESC"
        statement = (
            f"WITH mine AS MATERIALIZED (SELECT {distinct}{k} AS k, {quote_ident(t.text)} AS t, "
            f"{quote_ident(t.metadata)} AS m, {vector} AS v FROM {t.qualified} "
            f"WHERE {t.scoped()} AND {self._mine()}{order}) "
            "SELECT (SELECT rev FROM pbr_revisions WHERE tbl = to_regclass(:tbl) "
            "AND user_key = :key AND owner = :user), (SELECT count(*) FROM pg_trigger "
            "WHERE tgrelid = to_regclass(:tbl) AND tgname IN (:rev, :trunc) "
            "AND tgenabled <> 'D'), (SELECT json_agg(json_build_array(k, t, m) ORDER BY k) "
            "FROM mine), (SELECT string_agg(coalesce(v, '\\x00000000'::bytea), ''::bytea "
            "ORDER BY k) FROM mine), s.rev, s.state FROM (SELECT 1) one LEFT JOIN pbr_states s "
            "ON s.tbl = to_regclass(:tbl) AND s.reader = :reader AND s.owner = :user"
        )
        params = t.params(
            tbl=t.regclass,
            key=self.user_key,
            user=user_id,
            reader=self._reader(),
            **self._trigger_names(),
        )
        binary = getattr(self.sql, "binary", None)
        rows = binary(statement, params) if binary is not None else None
        if rows is None:
            rows = self.sql([(statement, params)])
        rev, armed, listed, vectors, state_rev, state = rows[0]
        if isinstance(listed, str):
            listed = json.loads(listed)
        listed = listed or []
        parsed = parse_vectors(vectors, len(listed))
        out = []
        for (key, text, meta), vec in zip(listed, parsed):
            if isinstance(meta, str):
                meta = json.loads(meta)
            key, text = str(key), text or ""
            meta = dict(meta or {})
            if self._read_metadata is not None:
                meta = self._read_metadata(key, meta, text)
            record = Record.stored(key, text, meta, vec, user_key=self.user_key)
            if record is not None and record.user_id == user_id:
                out.append(record)
        token = None if armed != 2 else ("none" if rev is None else str(rev))
        shared = None
        if token is not None and state_rev is not None and state is not None:
            shared = (str(state_rev), bytes(state))
        return UserRows(token=token, records=out, state=shared)

    def write_state(self, user_id: str, token: str, state: bytes) -> bool:
        """Keep ``state`` (:func:`pbr_core.derived.pack`) as ``user_id``'s derived state at
        change token ``token``, for other workers' :meth:`read_user`; written only if the
        user's rows are still at that token (else it would describe other rows). Returns
        whether it was written."""
        if not self.tokens or self.owner is not None or token == "none":
            return False
        rows = self.sql(
            [
                (
                    "INSERT INTO pbr_states (tbl, reader, owner, rev, state) SELECT "
                    "to_regclass(:tbl), :reader, :user, CAST(:rev AS bigint), :state WHERE "
                    "(SELECT rev FROM pbr_revisions WHERE tbl = to_regclass(:tbl) AND "
                    "user_key = :key AND owner = :user) = CAST(:rev AS bigint) "
                    "ON CONFLICT (tbl, reader, owner) DO UPDATE SET rev = EXCLUDED.rev, "
                    "state = EXCLUDED.state RETURNING 1",
                    {
                        "tbl": self.table.regclass,
                        "reader": self._reader(),
                        "user": user_id,
                        "key": self.user_key,
                        "rev": token,
                        "state": state,
                    },
                )
            ]
        )
        return bool(rows)

    def _reader(self) -> str:
        """Who reads the table this way: the derived state of one reading (table, columns,
        scope, owner key) is never taken by another."""
        t = self.table
        raw = json.dumps(
            [
                t.schema,
                t.name,
                t.key,
                t.text,
                t.metadata,
                t.vector,
                t.scope_column,
                None if t.scope is None else str(t.scope),
                t.newest,
                self.user_key,
            ]
        )
        return hashlib.blake2b(raw.encode(), digest_size=16).hexdigest()

    def _trigger_names(self) -> dict[str, str]:
        suffix = self.table.suffix(self.user_key)
        return {"rev": f"pbr_rev_{suffix}", "trunc": f"pbr_trunc_{suffix}"}

    # -- reading -------------------------------------------------------------------------------
    def rows(self, user_id: str, keys: Sequence[str] | None) -> list[tuple[str, str, dict]]:
        """``(key, text, stored metadata)`` of the user's rows (all, or of ``keys``)."""
        return [(k, text, meta) for k, text, meta, _ in self._select(user_id, keys, False)]

    def _mine(self) -> str:
        if self.owner is not None:  # a per-user table: every row is its user's
            return "TRUE"
        return f"{self.table.owner_expr(self.user_key)} = :user"

    def _select(
        self, user_id: str, keys: Sequence[str] | None, vectors: bool
    ) -> list[tuple[str, str, dict[str, Any], Any]]:
        t = self.table
        k = quote_ident(t.key)
        vector = self._vector_select() if vectors else "NULL"
        where = f"{t.scoped()} AND {self._mine()}"
        params = t.params(user=user_id)
        if keys is not None:
            where += f" AND {k} = ANY(:keys)"
            params["keys"] = list(keys)
        distinct, order = "", ""
        if t.newest is not None:  # several rows of one key: the newest is the record
            distinct = f"DISTINCT ON ({k}) "
            order = f" ORDER BY {k}, {quote_ident(t.newest)} DESC"
        statement = (
            f"SELECT {distinct}{k}, {quote_ident(t.text)}, {quote_ident(t.metadata)}, {vector} "
            f"FROM {t.qualified} WHERE {where}{order}"
        )
        out = []
        for key, text, meta, vec in self.sql([(statement, params)]):
            if isinstance(meta, str):
                meta = json.loads(meta)
            out.append((str(key), text or "", dict(meta or {}), vec))
        return out

    def _vector_select(self) -> str:
        """The vector column as a read selects it: binary (pgvector's ``vector_send``, named
        in the schema that holds the column's type) where the column is a ``vector``, about
        ten times cheaper to produce and parse than the text form (1k rows of dimension 384:
        ~0.2 s of parsing text); the text form for any other type (``halfvec``) or where the
        type cannot be looked up. Looked up once."""
        if self._vector_sql is None:
            t = self.table
            text_form = f"{quote_ident(t.vector)}::text"
            try:
                rows = self.sql(
                    [
                        (
                            "SELECT n.nspname, ty.typname FROM pg_attribute a JOIN pg_type ty "
                            "ON ty.oid = a.atttypid JOIN pg_namespace n ON n.oid = "
                            "ty.typnamespace WHERE a.attrelid = to_regclass(:tbl) "
                            "AND a.attname = :col",
                            {"tbl": t.regclass, "col": t.vector},
                        )
                    ]
                )
            except Exception:
                return text_form  # looked up again next time
            if rows and rows[0][1] == "vector":
                self._vector_sql = f"{quote_ident(rows[0][0])}.vector_send({quote_ident(t.vector)})"
            else:
                self._vector_sql = text_form
        return self._vector_sql

    def _read(self, user_id: str, keys: Sequence[str] | None, *, vectors: bool) -> list[Record]:
        out = []
        for key, text, meta, vec in self._select(user_id, keys, vectors):
            if self._read_metadata is not None:
                meta = self._read_metadata(key, meta, text)
            record = Record.stored(
                key, text, meta, parse_vector(vec), user_key=self.user_key, owner=self.owner
            )
            if record is not None and record.user_id == user_id:
                out.append(record)
        return out


def engine_sql(engine: Any) -> Sql:
    """:data:`Sql` over a SQLAlchemy ``Engine`` (both frameworks' PostgreSQL stores hold one):
    each call is one transaction (``engine.begin()``). SQLAlchemy is imported here, not at the
    top: it comes with those stores, never with pbr_core. Over psycopg 3 it also reads in
    binary form (:meth:`_EngineSql.binary`)."""
    return _EngineSql(engine)


class _EngineSql:
    """:func:`engine_sql`'s callable."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def __call__(
        self, statements: Sequence[tuple[str, Mapping[str, Any]]]
    ) -> list[tuple[Any, ...]]:
        from sqlalchemy import text

        rows: list[tuple[Any, ...]] = []
        with self.engine.begin() as conn:
            for statement, params in statements:
                if params:
                    result = conn.execute(text(statement), dict(params))
                    rows = [tuple(r) for r in result] if result.returns_rows else []
                else:  # DDL holding '%' or ':' (plpgsql bodies): the driver parses nothing
                    cursor = conn.connection.cursor()
                    try:
                        cursor.execute(statement)
                        rows = [tuple(r) for r in cursor.fetchall()] if cursor.description else []
                    finally:
                        cursor.close()
        return rows

    def binary(self, statement: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]] | None:
        """One statement (``:name`` placeholders) with its results in PostgreSQL's binary form:
        a ``bytea`` arrives as bytes, not as hex text to decode (a 1.5 MB read: ~1.4 ms
        instead of ~7). None where the driver is not psycopg 3, or where a quoted name or
        literal holds a colon (the placeholders could not be told from it): the caller runs
        it through :meth:`__call__`."""
        if not params or any(":" in m.group() for m in _QUOTED.finditer(statement)):
            return None
        names = "|".join(re.escape(n) for n in sorted(params, key=len, reverse=True))
        converted = re.sub(rf"(?<![:\w]):({names})\b", r"%(\1)s", statement.replace("%", "%%"))
        with self.engine.begin() as conn:
            driver = conn.connection.driver_connection
            if not hasattr(driver, "pgconn"):  # psycopg2 has no binary results
                return None
            cursor = driver.cursor()
            try:
                cursor.execute(converted, dict(params), binary=True)
                return [tuple(r) for r in cursor.fetchall()]
            finally:
                cursor.close()


#: A SQL string literal or quoted identifier (a doubled quote inside is part of it).
_QUOTED = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"")


def async_engine_sql(engine: Any, run: Callable[[Any], Any]) -> Sql:
    """:data:`Sql` over a SQLAlchemy ``AsyncEngine``, each call one transaction, driven to
    completion by ``run(coroutine)`` (LangChain's ``PGEngine._run_as_sync``, which runs it on the
    engine's own event loop). Statements without parameters go to the driver connection as they
    are (plpgsql bodies hold ``%`` and ``:``)."""
    from sqlalchemy import text

    async def go(statements: Sequence[tuple[str, Mapping[str, Any]]]) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = []
        async with engine.begin() as conn:
            for statement, params in statements:
                if params:
                    result = await conn.execute(text(statement), dict(params))
                    rows = [tuple(r) for r in result] if result.returns_rows else []
                else:
                    raw = await conn.get_raw_connection()
                    await raw.driver_connection.execute(statement)
                    rows = []
        return rows

    def call(statements: Sequence[tuple[str, Mapping[str, Any]]]) -> list[tuple[Any, ...]]:
        return list(run(go(list(statements))))

    return call
