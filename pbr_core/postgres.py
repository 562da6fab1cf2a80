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
  it where the table has none (named ``pbr_owner_*``; with the table's oid where a table renamed
  away kept that name). A listing is then an index scan of the user's rows, whatever the
  table's size.
* **Vectors read back** in pgvector's binary form (``vector_send``; the text form
  ``[0.1,0.2,...]`` for a ``halfvec`` column), parsed here: no driver type registration needed.
* **Cheap verification.** :meth:`PgRecords.setup` installs a row trigger (``pbr_rev_*``) that
  stamps ``pbr_revisions(tbl, user_key, owner)`` with a fresh value of the sequence
  ``pbr_revision_seq`` on every insert, update or delete of an owner's row, whoever makes it (the
  framework, pbr, plain SQL; ``TRUNCATE`` stamps every owner of the table).
  :meth:`PgRecords.change_token` reads that one row by primary key; :class:`~pbr_core.corpus.Corpus`
  lists the user again only when it changed. The stamp is written in the writer's transaction,
  so it becomes visible together with the rows; a sequence never repeats a value, so a token
  seen once cannot come back after other changes. The triggers fire for every session
  (``ENABLE ALWAYS``), and the token also holds their catalog rows' versions, so turning them
  off and on around a write changes it. pbr's tables, sequence and functions live in the
  guarded table's schema, named in full (:meth:`PgTable.own`). Where the role may not create
  the trigger (no ``CREATE`` / ownership of the table) or read the revisions, the token is None
  and every read lists, as for Chroma.
* **Ownership in SQL too.** Deletes and reads name the owner in their ``WHERE`` clause
  (defence in depth behind :func:`~pbr_core.corpus.scoped_key`).
* **Writes in one statement.** Where the adapter says what row its framework writes for a
  record (``rows``: :class:`PgRow`, the framework's own values) and the table looks as that
  framework creates it (:meth:`PgRecords.bulk_plan`), :meth:`PgRecords.upsert` writes the batch
  itself: one ``INSERT ... SELECT FROM unnest(...)`` of the same columns, the vectors bound as
  one binary ``float4[]`` (:class:`Float4Array`) sliced and cast to the vector column's type by
  the server, replacing rows of the same key as the framework does (``ON CONFLICT (key) DO
  UPDATE`` of the same columns; where the key is not unique, a ``DELETE`` of the keys first, in
  the same transaction). The framework's own write turns every float into text in Python and
  builds one bind parameter per value; this skips both. Anything else (another column the
  database does not fill, a ``halfvec`` column, no unique key) keeps the framework's write.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import re
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .corpus import Record

__all__ = [
    "BulkPlan",
    "Float4Array",
    "PgRecords",
    "PgRow",
    "PgTable",
    "QueryVector",
    "ScoredRows",
    "Sql",
    "UserRows",
    "async_engine_sql",
    "engine_sql",
    "json_dumps_of",
    "parse_vector",
    "parse_vectors",
    "quote_ident",
    "quote_literal",
    "record_rows",
    "token_columns",
    "transaction",
]

log = logging.getLogger("pbr.postgres")

#: Runs ``(statement, parameters)`` pairs in one transaction (``:name`` placeholders, lists
#: bound as arrays, a :class:`Float4Array` as a ``float4[]``) and returns the last statement's
#: rows (empty for one without rows).
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
    """``n`` vectors of pgvector's binary form (``vector_send``) back to back, a NULL vector
    written as a zero dimension, as float32 arrays (None for NULL): one pass over a user's
    vectors instead of one array per row."""
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
        shares: whether this table keeps shared states at all (a role that may not read them:
            no; nothing is then taken or offered).
    """

    token: str | None
    records: list[Record]
    state: tuple[str, bytes] | None
    shares: bool = True


#: A row whose text and metadata take at most this many bytes (a chat message, a memory) comes
#: with them in the scored read: fetching them for the rows a request shows costs a round trip
#: (0.3-0.7 ms), more than such rows' texts cost in the statement (a 100-item user's first
#: request: 3.3 ms against 2.3). Longer ones (notes, documents) are read for the rows shown.
INLINE_BYTES = 256


@dataclass(frozen=True)
class ScoredRows:
    """What :meth:`PgRecords.read_scored` read in one statement: every row of a user, by its
    key, cosine with the query and row version, without its vector; with its text and metadata
    where they are short (:data:`INLINE_BYTES`), the others read afterwards for the rows a
    request shows (:attr:`records`).

    Attributes:
        token: the change token of these rows, None where it cannot be told.
        state: the user's shared derived state at exactly this token, else None.
        keys: every row's key, in code-point order (a NULL key last).
        cosines: each row's cosine with the query, in the order of ``keys`` (NaN for a row
            whose vector is of another dimension than the query).
        stamps: each row's version (``xmin``), in the order of ``keys``.
        records: the rows at some indexes of ``keys`` as their owner's records (no vector),
            the long ones read in one statement: None for a row that is not the user's, or
            (read afterwards) that is no longer the version of ``stamps`` (changed or deleted
            since).
    """

    token: str | None
    state: bytes | None
    keys: list[str]
    cosines: np.ndarray
    stamps: list[str]
    records: Callable[[Sequence[int]], list[Record | None]]


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
        scope: the value of ``scope_column``, or the parameter ``scope_lookup`` reads it from.
        scope_lookup: SQL giving the scope column's value from ``:pbr_scope``, run by every
            statement (LangChain's collection uuid by the collection's name: a collection
            re-created by another process gets another uuid, which the store itself looks up
            by name on every call); None: ``scope`` is the value.
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
    scope_lookup: str | None = None

    @property
    def qualified(self) -> str:
        return f"{quote_ident(self.schema)}.{quote_ident(self.name)}"

    def own(self, name: str) -> str:
        """pbr's own table, sequence or function ``name`` guarding this table: in its schema,
        named in full wherever it is used, so that neither a session's ``search_path`` nor a
        temporary table of the same name can put another in its place."""
        return f"{quote_ident(self.schema)}.{name}"

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
        return f"{quote_ident(self.scope_column)} = {self.scope_value}"

    @property
    def scope_value(self) -> str:
        """SQL of the scope column's value for this store's rows."""
        return self.scope_lookup or ":pbr_scope"

    def params(self, **more: Any) -> dict[str, Any]:
        out = dict(more)
        if self.scope_column is not None:
            out["pbr_scope"] = self.scope
        return out

    def suffix(self, user_key: str) -> str:
        """A short stable name part for pbr's index and trigger on this table and key."""
        raw = json.dumps([self.schema, self.name, self.metadata, self.scope_column, user_key])
        return hashlib.blake2b(raw.encode(), digest_size=6).hexdigest()


class QueryVector:
    """One vector bound as pgvector's ``vector`` (the statement casts the parameter to it).

    :func:`engine_sql` sends it in pgvector's binary form where the driver is psycopg 3 (the
    dimension, then big-endian float32s: ~0.2 ms less per statement than formatting and parsing
    384 numbers as text), its text form (``[x,y,...]``) through any other driver. Either way
    the database holds the float32 nearest to each value.
    """

    __slots__ = ("values",)

    def __init__(self, vector: Any) -> None:
        self.values = np.asarray(vector, dtype=np.float64).reshape(-1)

    def text(self) -> str:
        """pgvector's text form (JSON's float formatting runs in C)."""
        return json.dumps(self.values.tolist(), separators=(",", ":"))

    def binary(self) -> bytes:
        """pgvector's binary form (``vector_recv``): the dimension and a reserved zero as
        big-endian 16-bit integers, then each value as a big-endian float32."""
        head = struct.pack(">HH", self.values.shape[0], 0)
        return head + self.values.astype(">f4").tobytes()


class Float4Array:
    """A batch of vectors bound as one flat ``float4[]`` parameter (row-major).

    :func:`engine_sql` sends it in PostgreSQL's binary array form where the driver is psycopg 3
    (built by numpy: no float is formatted as text); any other driver gets :meth:`tolist`.
    """

    __slots__ = ("values",)

    def __init__(self, rows: Any) -> None:
        self.values = np.ascontiguousarray(rows, dtype=np.float32).reshape(-1)

    def tolist(self) -> list[float]:
        return [float(x) for x in self.values.tolist()]

    def binary(self) -> bytes:
        """PostgreSQL's binary form of a one-dimensional ``float4[]`` without NULLs: dimensions,
        a no-NULL flag, the element type (``float4``, oid 700), the length and lower bound, then
        each element as its length (4) and a big-endian float."""
        n = self.values.shape[0]
        body = np.empty(n, dtype=[("len", ">i4"), ("value", ">f4")])
        body["len"] = 4
        body["value"] = self.values
        return struct.pack(">iiiii", 1, 0, 700, n, 1) + body.tobytes()


@dataclass(frozen=True)
class PgRow:
    """One row as a framework writes it for a record: its own key, text and metadata (the JSON
    value it stores, e.g. LlamaIndex's node dict) and the vector."""

    key: str
    text: str
    metadata: Mapping[str, Any]
    vector: Any


def record_rows(records: Sequence[Record]) -> list[PgRow]:
    """Rows that hold the records as they are (LangChain ``PGVector``'s: key, text, metadata,
    vector; an empty metadata stored as ``{}``)."""
    return [PgRow(r.key, r.text, dict(r.metadata), r.vector) for r in records]


@dataclass(frozen=True)
class BulkPlan:
    """How :meth:`PgRecords.upsert` writes a batch itself (:meth:`PgRecords.bulk_plan`): the
    column types as the table declares them (``format_type``), whether the key is unique."""

    key_type: str
    text_type: str
    metadata_type: str
    vector_type: str
    scope_type: str | None
    unique_key: bool

    def statements(
        self,
        table: PgTable,
        rows: Sequence[PgRow],
        dumps: Callable[[Any], str],
        owners: tuple[str, Sequence[str]] | None = None,
    ) -> list[tuple[str, Mapping[str, Any]]]:
        """The statements writing ``rows`` (one transaction): an upsert by key, or where the
        key is not unique a delete of the keys, then the inserts. ``owners``: the user key and
        each row's owner (rows sorted by owner), where the table holds several users' rows: a
        key another user's row also has (LlamaIndex's ``node_id`` is not unique) is deleted
        for the row's owner only, and each owner's delete and insert run before the next
        owner's, so pbr's trigger locks the owners' revision rows in owner order (a delete of
        all the keys first, then the inserts, locked them in two orders: workers deadlocked)."""
        if owners is not None and not self.unique_key:
            user_key, of_rows = owners
            out: list[tuple[str, Mapping[str, Any]]] = []
            start = 0
            while start < len(rows):
                end = start
                while end < len(rows) and of_rows[end] == of_rows[start]:
                    end += 1
                part = rows[start:end]
                delete = (
                    f"DELETE FROM {table.qualified} WHERE {table.scoped()} AND "
                    f"{table.owner_expr(user_key)} = :pbr_owner AND "
                    f"{quote_ident(table.key)} = ANY(:pbr_keys)"
                )
                keys = [r.key for r in part]
                out.append((delete, table.params(pbr_owner=of_rows[start], pbr_keys=keys)))
                out.extend(self.statements(table, part, dumps)[1:])
                start = end
            return out
        t = table
        key, text, meta, vec = (quote_ident(c) for c in (t.key, t.text, t.metadata, t.vector))
        vectors = np.stack([np.asarray(r.vector, dtype=np.float32).reshape(-1) for r in rows])
        dim = vectors.shape[1]
        columns = [key, text, meta, vec]
        values = [
            f"CAST(r.k AS {self.key_type})",
            f"CAST(r.t AS {self.text_type})",
            f"CAST(r.m AS {self.metadata_type})",
            f"CAST(v.a[(r.i - 1) * {dim} + 1 : r.i * {dim}] AS {self.vector_type})",
        ]
        if t.scope_column is not None:
            columns.insert(1, quote_ident(t.scope_column))
            values.insert(1, f"CAST({t.scope_value} AS {self.scope_type})")
        keys = [r.key for r in rows]
        # The vectors once (a materialized CTE), each row's slice cast by the server.
        insert = (
            "WITH v AS MATERIALIZED (SELECT CAST(:pbr_vectors AS real[]) AS a) "
            f"INSERT INTO {t.qualified} ({', '.join(columns)}) SELECT {', '.join(values)} "
            "FROM unnest(CAST(:pbr_keys AS text[]), CAST(:pbr_texts AS text[]), "
            "CAST(:pbr_metas AS text[])) WITH ORDINALITY AS r(k, t, m, i), v"
        )
        if t.scope_lookup is not None:  # a scope gone meanwhile writes nothing (checked below)
            insert += f" WHERE {t.scope_value} IS NOT NULL"
        insert += " ORDER BY r.i"
        params = t.params(
            pbr_vectors=Float4Array(vectors),
            pbr_keys=keys,
            pbr_texts=[r.text for r in rows],
            pbr_metas=[dumps(r.metadata) for r in rows],
        )
        if self.unique_key:
            insert += (
                f" ON CONFLICT ({key}) DO UPDATE SET {text} = EXCLUDED.{text}, "
                f"{meta} = EXCLUDED.{meta}, {vec} = EXCLUDED.{vec} RETURNING 1"
            )
            return [(insert, params)]
        # A key column without a unique index (LlamaIndex's node_id): the old rows of these keys
        # go first, in the same transaction, as the framework's replacement does; of the rows'
        # owners only (another user may hold a row of the same key), through the owner index.
        delete = f"DELETE FROM {t.qualified} WHERE {t.scoped()} AND {key} = ANY(:pbr_keys)"
        return [(delete, t.params(pbr_keys=keys)), (insert + " RETURNING 1", params)]


# The columns of a table, their types and whether the database fills them (a default, an
# identity, a generated column), and whether a non-partial unique index is on one column alone.
_COLUMNS = (
    "SELECT a.attname, format_type(a.atttypid, a.atttypmod), ty.typname, "
    "a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '', EXISTS (SELECT 1 FROM "
    "pg_index i WHERE i.indrelid = a.attrelid AND i.indisunique AND i.indnkeyatts = 1 "
    "AND i.indkey[0] = a.attnum AND i.indpred IS NULL AND i.indexprs IS NULL) "
    "FROM pg_attribute a JOIN pg_type ty ON ty.oid = a.atttypid "
    "WHERE a.attrelid = to_regclass(:tbl) AND a.attnum > 0 AND NOT a.attisdropped"
)
_TEXT_TYPES = ("text", "varchar")
_JSON_TYPES = ("json", "jsonb")


# The change token's two columns (:meth:`PgRecords.change_token`): the owner's revision and
# the two triggers' state (how each is enabled, and the version of its catalog row), read in
# one statement with whatever it guards.
def token_columns(table: PgTable) -> str:
    """The two columns, over ``table`` (its schema holds pbr's own tables). Where the store's
    rows are looked up by name each time (a LangChain collection), the second also holds the
    scope the name finds now: a collection renamed in its place (a blue/green re-index) moves
    the token though no row changed."""
    triggers = (
        "(SELECT string_agg(tgenabled::text || xmin::text, ',' ORDER BY tgname) FROM pg_trigger "
        "WHERE tgrelid = to_regclass(:tbl) AND tgname IN (:rev, :trunc))"
    )
    # Writes no row trigger sees: a rewrite of the table (ALTER TABLE ... TYPE ... USING, which
    # may change every row) or of a partition, a TRUNCATE of one partition, a partition
    # attached or detached, each give the table's or its leaf partitions' files new numbers;
    # rows inserted into a child table that is not a partition (INHERITS) fire the child's
    # triggers only, so such a table has no token.
    storage = (
        "coalesce(pg_relation_filenode(to_regclass(:tbl))::text, '') || ',' || coalesce(("
        "SELECT string_agg(pg_relation_filenode(relid)::text, ',' ORDER BY relid) FROM "
        "pg_partition_tree(to_regclass(:tbl)) WHERE isleaf), '') || CASE WHEN EXISTS ("
        "SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent "
        f"= to_regclass(:tbl) AND NOT c.relispartition) THEN '{_CHILDREN}' ELSE '' END"
    )
    triggers = f"({triggers} || '|' || {storage})"
    if table.scope_lookup is not None:
        triggers = f"({triggers} || '|' || coalesce(({table.scope_lookup})::text, ''))"
    return (
        f"(SELECT rev FROM {table.own('pbr_revisions')} WHERE tbl = to_regclass(:tbl) AND "
        f"user_key = :key AND owner = :user), {triggers}"
    )


def _token(rev: Any, triggers: Any) -> str | None:
    """The change token of :func:`token_columns`: the revision, the triggers' row versions
    and the table's file, so that a trigger disabled and enabled again (``pg_restore
    --disable-triggers``, a bulk load) or a rewrite of the table changes it, whatever was
    written meanwhile; None unless both triggers fire for every session (``ENABLE ALWAYS``: a
    replication apply worker or a session with ``session_replication_role = replica`` skips an
    ordinary trigger), and None for a table with child tables that are not partitions."""
    armed, _, storage = triggers.partition("|") if isinstance(triggers, str) else ("", "", "")
    parts = armed.split(",") if armed else []
    if len(parts) != 2 or not all(part.startswith("A") for part in parts):
        return None
    if _CHILDREN in storage.split("|", 1)[0]:
        return None
    return f"{'none' if rev is None else rev}@{triggers}"


#: What :func:`token_columns` says of a table with child tables that are not partitions.
_CHILDREN = "+children"


def _revision(token: str) -> str:
    """The owner's revision in a change token (``"none"``: no row yet)."""
    return token.split("@", 1)[0]


def _by_key(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A row's place in a user's rows, the same on every worker: its key, compared by code
    point (PostgreSQL's ``"C"`` collation of UTF-8; a NULL key last), then, for a key that is
    not unique, its text, metadata and vector."""
    key, text, meta, vector = row[:4]
    return (key is None, key or "", text or "", meta or "", bytes(vector or b""))


#: Whether pbr's install on a table is this version's: its triggers (enabled ALWAYS, this
#: version's functions, in the table's schema: security definer with ``pg_temp`` last,
#: stamping a partition's writes as its partitioned table's), ``pbr_states`` and the owner index.
_CURRENT = (
    "to_regclass(:states) IS NOT NULL AND (SELECT count(*) FROM pg_proc WHERE pronamespace = "
    "to_regnamespace(:schema) AND proname IN ('pbr_bump_revision', 'pbr_truncate_revision') AND "
    "prosecdef AND prosrc LIKE '%pg_partition_root%' AND array_to_string(proconfig, ',') LIKE "
    "'%pg_temp%') = 2 AND (SELECT count(*) FROM pg_trigger t JOIN pg_proc f ON f.oid = "
    "t.tgfoid WHERE t.tgrelid = to_regclass(:tbl) AND t.tgname IN (:rev, :trunc) AND "
    "t.tgenabled = 'A' AND f.pronamespace = to_regnamespace(:schema)) = 2 AND EXISTS (SELECT 1 "
    "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = "
    "to_regclass(:tbl) AND c.relname LIKE :index)"
)


#: True in :meth:`PgRecords.setup`'s transaction unless another worker installed pbr on the
#: table while this one waited for the lock.
_NOT_INSTALLED = "current_setting('pbr.installed', true) IS DISTINCT FROM 'true'"


def _owner_index(table: PgTable, suffix: str, columns: str) -> str:
    """The DDL of pbr's owner index on ``table`` (``columns``: the scope column and the owner
    expression), where the table has none yet: named ``pbr_owner_<suffix>``, or, where another
    table holds that name (a table renamed away, this one made under its old name), that name
    and this table's oid. (``CREATE INDEX IF NOT EXISTS`` would see the other table's index
    and create none: every listing a sequential scan.)"""
    name = f"pbr_owner_{suffix}"
    this = f"{quote_literal(table.qualified)}::regclass"
    # format()'s template: '%' doubled in the names (format reads only its own %I), then the
    # quotes doubled for the SQL string the template is
    template = "CREATE INDEX %I ON " + f"{table.qualified} ({columns})".replace("%", "%%")
    body = (
        "BEGIN IF NOT EXISTS (SELECT 1 FROM pg_index i JOIN pg_class c ON "
        f"c.oid = i.indexrelid WHERE i.indrelid = {this} AND c.relname LIKE "
        f"{quote_literal(name.replace('_', chr(92) + '_') + '%')}) THEN EXECUTE format("
        f"{quote_literal(template)}, CASE WHEN to_regclass({quote_literal(table.own(name))}) IS "
        f"NULL THEN {quote_literal(name)} ELSE {quote_literal(name + '_')} || {this}::oid END); "
        "END IF; END"
    )
    return f"DO {_dollar_quoted(body)}"  # a name may hold the dollar quote's tag


def _unusable(exc: BaseException) -> bool:
    """Whether ``exc`` says a function cannot be used (SQLSTATE class 42, a name, type or
    right that does not fit; or 0A, not supported), rather than that this call failed (a lost
    connection, a timeout, a cancel)."""
    for error in (exc, getattr(exc, "orig", None), exc.__cause__):
        state = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        if isinstance(state, str):
            return state[:2] in {"42", "0A"}
    return False


#: A ``:name`` placeholder (not the second colon of a ``::`` cast).
_PLACEHOLDER = re.compile(r"(?<![:\w]):(\w+)\b")


def _dollar_quoted(body: str) -> str:
    """``body`` between dollar quotes whose tag it does not hold."""
    tag, n = "$pbr$", 0
    while tag in body:
        n += 1
        tag = f"$pbr{n}$"
    return f"{tag} {body} {tag}"


def _holds_nul(value: Any) -> bool:
    """Whether a NUL character is in ``value``'s strings (keys included, at any depth): what
    PostgreSQL's text and JSON refuse. (The six characters ``\\u0000`` are no NUL.)"""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, Mapping):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_holds_nul(v) for v in value)
    return False


def _row(key: Any, text: Any, meta: Any) -> tuple[str, str, dict[str, Any]]:
    """A row's key, text and metadata as Python reads them (JSON text parsed, NULLs empty)."""
    if isinstance(meta, str):
        meta = json.loads(meta)
    return str(key), text or "", dict(meta or {})


#: pbr's tables and trigger functions, in the schema ``@S@`` of the table they guard; the
#: functions run with that schema first and ``pg_temp`` last (a temporary table named like
#: pbr's cannot catch their writes).
_FUNCTIONS = r"""
CREATE TABLE IF NOT EXISTS @S@.pbr_revisions (
    tbl oid NOT NULL, user_key text NOT NULL, owner text NOT NULL, rev bigint NOT NULL,
    PRIMARY KEY (tbl, user_key, owner));
CREATE SEQUENCE IF NOT EXISTS @S@.pbr_revision_seq;
CREATE TABLE IF NOT EXISTS @S@.pbr_states (
    tbl oid NOT NULL, owner text NOT NULL, reader text NOT NULL, rev bigint NOT NULL,
    state bytea NOT NULL, PRIMARY KEY (tbl, owner, reader));
CREATE OR REPLACE FUNCTION @S@.pbr_bump_revision() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = @S@, pg_temp AS $pbr$
DECLARE
    who text;
    -- the table pbr reads: a partition's rows are its partitioned table's
    rel oid := COALESCE(pg_partition_root(TG_RELID), TG_RELID);
BEGIN
    IF TG_OP <> 'INSERT' THEN
        EXECUTE format('SELECT ($1).%I ->> %L', TG_ARGV[1], TG_ARGV[0]) INTO who USING OLD;
        IF who IS NOT NULL THEN
            INSERT INTO pbr_revisions VALUES (rel, TG_ARGV[0], who,
                nextval('pbr_revision_seq'))
            ON CONFLICT ON CONSTRAINT pbr_revisions_pkey DO UPDATE SET rev = EXCLUDED.rev;
            DELETE FROM pbr_states WHERE tbl = rel AND owner = who;
        END IF;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        EXECUTE format('SELECT ($1).%I ->> %L', TG_ARGV[1], TG_ARGV[0]) INTO who USING NEW;
        IF who IS NOT NULL THEN
            INSERT INTO pbr_revisions VALUES (rel, TG_ARGV[0], who,
                nextval('pbr_revision_seq'))
            ON CONFLICT ON CONSTRAINT pbr_revisions_pkey DO UPDATE SET rev = EXCLUDED.rev;
            DELETE FROM pbr_states WHERE tbl = rel AND owner = who;
        END IF;
    END IF;
    RETURN NULL;
END $pbr$;
CREATE OR REPLACE FUNCTION @S@.pbr_truncate_revision() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = @S@, pg_temp AS $pbr$
DECLARE
    rel oid := COALESCE(pg_partition_root(TG_RELID), TG_RELID);
BEGIN
    UPDATE pbr_revisions SET rev = nextval('pbr_revision_seq') WHERE tbl = rel;
    DELETE FROM pbr_states WHERE tbl = rel;
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
        rows: records -> the rows the framework writes for them (:class:`PgRow`), where those
            rows fill the table's key, text, metadata and vector columns (and the scope column
            with the scope) and nothing else the database does not fill itself; then pbr
            writes them in one statement (:meth:`bulk_plan`). None: always ``write``.
        dumps: how the framework turns a metadata value into JSON text (its driver's JSON
            serializer): a ``json`` column keeps that text as it is. None: the ``sql``'s own
            (:func:`engine_sql` carries its engine's, :func:`json_dumps_of`), else
            ``json.dumps``.
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
        rows: Callable[[Sequence[Record]], list[PgRow]] | None = None,
        dumps: Callable[[Any], str] | None = None,
    ) -> None:
        self.table = table
        self.sql = sql
        self.user_key = user_key
        self._write = write
        self._read_metadata = read_metadata
        self.owner = owner
        self._rows = rows
        self._dumps: Callable[[Any], str] = (
            dumps if dumps is not None else getattr(sql, "dumps", json.dumps)
        )
        self.tokens = False  # whether change_token reads the trigger's revisions
        self.states = False  # whether cold reads read and share derived states (pbr_states)
        self._vector_sql: str | None = None  # how a read selects the vector (_vector_select)
        self._vector_schema: str | None = None  # pgvector's schema, where the column is a vector
        self._scored_call: str | None = None  # how read_scored runs (_scored); None: not looked
        self._bulk: BulkPlan | None = None  # how pbr writes a batch (bulk_plan)
        self._bulk_known = rows is None  # whether bulk_plan has looked (nothing to look for)
        if setup:
            self.setup()

    # -- setup ---------------------------------------------------------------------------------
    def setup(self) -> None:
        """Create the owner index and the revision trigger (idempotent; under an advisory lock,
        so two workers starting at once do not race). A role that may not create them gets a
        warning, and verification lists every read."""
        t, key = self.table, self.user_key
        suffix = t.suffix(key)
        armed, current = self._installed()
        if armed and current:  # the usual case: no DDL, no lock on the table
            self._ready()
            return
        owner = t.owner_expr(key)
        scope = f"{quote_ident(t.scope_column)}, " if t.scope_column else ""
        meta = quote_ident(t.metadata)
        statements: list[tuple[str, Mapping[str, Any]]] = [
            (f"SELECT pg_advisory_xact_lock({_LOCK})", {}),
            # Installed meanwhile by a worker that held the lock first: then the owners' stamps
            # and the shared states stay (each worker starting at once re-stamped every owner,
            # invalidating every cache, after a scan of the whole table).
            (
                f"SELECT set_config('pbr.installed', ({_CURRENT})::text, true)",
                self._current_params(),
            ),
            (_owner_index(t, suffix, f"{scope}{owner}"), {}),
            (_FUNCTIONS.replace("@S@", quote_ident(t.schema)), {}),
            (
                f"CREATE OR REPLACE TRIGGER pbr_rev_{suffix} AFTER INSERT OR UPDATE OR DELETE "
                f"ON {t.qualified} FOR EACH ROW EXECUTE FUNCTION "
                f"{t.own('pbr_bump_revision')}({quote_literal(key)}, {quote_literal(t.metadata)})",
                {},
            ),
            (
                f"CREATE OR REPLACE TRIGGER pbr_trunc_{suffix} AFTER TRUNCATE ON {t.qualified} "
                f"FOR EACH STATEMENT EXECUTE FUNCTION {t.own('pbr_truncate_revision')}()",
                {},
            ),
            # Fired for every session, a replication apply worker's included.
            (f"ALTER TABLE {t.qualified} ENABLE ALWAYS TRIGGER pbr_rev_{suffix}", {}),
            (f"ALTER TABLE {t.qualified} ENABLE ALWAYS TRIGGER pbr_trunc_{suffix}", {}),
            # Owners whose rows were written before the trigger existed get a stamp, a new one
            # where an earlier stamp exists (a table dropped and made again may reuse its oid):
            # nothing read or derived before this trigger is trusted after it.
            (
                f"INSERT INTO {t.own('pbr_revisions')} SELECT to_regclass(:tbl), :key, o, "
                f"nextval({quote_literal(t.own('pbr_revision_seq'))}) FROM (SELECT DISTINCT "
                f"{meta} ->> "
                f"{quote_literal(key)} AS o FROM {t.qualified} WHERE {_NOT_INSTALLED}) owners "
                "WHERE o IS NOT NULL "
                "ON CONFLICT ON CONSTRAINT pbr_revisions_pkey DO UPDATE SET rev = EXCLUDED.rev",
                {"tbl": t.regclass, "key": key},
            ),
            # Derived states of this table, and of tables dropped since: not to be kept.
            (
                f"DELETE FROM {t.own('pbr_states')} WHERE {_NOT_INSTALLED} AND (tbl = "
                "to_regclass(:tbl) OR tbl NOT IN (SELECT oid FROM pg_class))",
                {"tbl": t.regclass},
            ),
        ]
        try:
            self.sql(statements)
        except Exception as exc:  # a read-only role: still correct, listing on every read
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if armed:  # an older pbr's install this role may not upgrade: revisions still work
                log.warning(
                    "pbr: could not upgrade pbr's functions on %s (%s); revisions still verify "
                    "every read, and a shared derived state is taken only for the exact rows it "
                    "was derived from",
                    t.qualified,
                    why,
                )
                self._ready()
                return
            log.warning(
                "pbr: could not create the owner index / revision trigger on %s (%s); every "
                "query lists the user's rows instead",
                t.qualified,
                why,
            )
            return
        self._ready()

    def _ready(self) -> None:
        """Revisions are armed: read them where this role may (else every read lists, with a
        warning), and the shared states this role may read."""
        revisions, states, compressed = self._access()
        if not revisions:
            log.warning(
                "pbr: this role may not read pbr_revisions (GRANT SELECT ON pbr_revisions, "
                "pbr_states TO it); every query of %s lists the user's rows instead",
                self.table.qualified,
            )
            return
        self.tokens, self.states = True, states
        if states and compressed:
            self._keep_states_uncompressed()

    def _keep_states_uncompressed(self) -> None:
        """Store ``pbr_states`` uncompressed (``STORAGE EXTERNAL``; this role owns it): a state
        is numbers that pglz halves at ~4.5 ms per 200 kB written (a 1k-item user's share, once
        per user and change). Only a speed setting: a failure changes nothing else (logged at
        debug level)."""
        try:
            states = self.table.own("pbr_states")
            self.sql([(f"ALTER TABLE {states} ALTER COLUMN state SET STORAGE EXTERNAL", {})])
        except Exception as exc:
            log.debug("pbr: pbr_states keeps its storage (%s)", exc)

    def _installed(self) -> tuple[bool, bool]:
        """(the table's two triggers exist, they and pbr's functions and ``pbr_states`` are
        this version's: in the table's schema, triggers enabled ALWAYS, functions security
        definer with ``pg_temp`` last, stamping a partition's writes as its partitioned
        table's)."""
        try:
            rows = self.sql(
                [
                    (
                        "SELECT (SELECT count(*) FROM pg_trigger WHERE tgrelid = "
                        f"to_regclass(:tbl) AND tgname IN (:rev, :trunc)), ({_CURRENT})",
                        self._current_params(),
                    )
                ]
            )
        except Exception:
            return False, False
        if not rows:
            return False, False
        return rows[0][0] == 2, bool(rows[0][1])

    def _current_params(self) -> dict[str, Any]:
        """The parameters of :data:`_CURRENT` for this table."""
        return {
            "tbl": self.table.regclass,
            "states": self.table.own("pbr_states"),
            "schema": quote_ident(self.table.schema),
            "index": f"pbr\\_owner\\_{self.table.suffix(self.user_key)}%",
            **self._trigger_names(),
        }

    def _access(self) -> tuple[bool, bool, bool]:
        """(whether this role may read ``pbr_revisions``, else it cannot verify by revision;
        whether it may read ``pbr_states``, else cold reads leave it out; whether its states
        are stored compressed in a table this role owns, so could be changed), in one
        statement."""
        try:
            rows = self.sql(
                [
                    (
                        "SELECT to_regclass(:revisions) IS NOT NULL AND "
                        "has_table_privilege(:revisions, 'SELECT'), "
                        "to_regclass(:states) IS NOT NULL AND "
                        "has_table_privilege(:states, 'SELECT'), (SELECT a.attstorage "
                        "<> 'e' AND pg_has_role(c.relowner, 'USAGE') FROM pg_attribute a JOIN "
                        "pg_class c ON c.oid = a.attrelid WHERE a.attrelid = "
                        "to_regclass(:states) AND a.attname = 'state')",
                        {
                            "revisions": self.table.own("pbr_revisions"),
                            "states": self.table.own("pbr_states"),
                        },
                    )
                ]
            )
        except Exception:
            return False, False, False
        if not rows:
            return False, False, False
        return bool(rows[0][0]), bool(rows[0][1]), bool(rows[0][2])

    # -- HostRecords ---------------------------------------------------------------------------
    def validate(self, records: Sequence[Record]) -> None:
        """PostgreSQL text and JSON cannot hold a NUL character."""
        for r in records:
            if "\x00" in r.text or _holds_nul(r.metadata):
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
        """Write ``records`` as the framework writes them, replacing rows of the same key: in
        one statement of pbr's where :meth:`bulk_plan` allows, else the framework's write."""
        if not records:
            return
        # In owner order: each owner's revision row is locked as its rows are written, so two
        # workers writing the same users lock them in the same order (else they deadlock).
        records = sorted(records, key=lambda r: r.user_id)
        plan = self.bulk_plan()
        if plan is None or self._rows is None:
            self._write(records)
            return
        owners = None if self.owner is not None else (self.user_key, [r.user_id for r in records])
        written = self.sql(plan.statements(self.table, self._rows(records), self._dumps, owners))
        one_insert = plan.unique_key or owners is None  # else the rows of the last owner's
        if self.table.scope_lookup is not None and one_insert and len(written) != len(records):
            # the scope was gone: the insert wrote no row
            raise ValueError(
                f"{self.table.scope_column} {self.table.scope!r} of {self.table.qualified} no "
                "longer exists (deleted by another process?): nothing was written; create it "
                "again, or make the store anew"
            )

    def bulk_plan(self) -> BulkPlan | None:
        """How pbr writes a batch itself, or None (the framework's write): only where ``rows``
        was given and the table is as the framework makes it: the key, text, metadata and
        vector columns (and the scope column) are there, of text (``text``/``varchar``), JSON
        (``json``/``jsonb``) and pgvector ``vector`` types, and every other column is filled
        by the database (a default, an identity, a generated column). The key needs a
        non-partial unique index of its own unless the table has a ``newest`` column (the key
        is then replaced by delete and insert). Looked up once (again after a failed look-up)."""
        if self._bulk_known:
            return self._bulk
        t = self.table
        try:
            found = self.sql([(_COLUMNS, {"tbl": t.regclass})])
        except Exception:
            return None  # looked up again next time
        columns = {
            name: (declared, typname, filled, unique)
            for name, declared, typname, filled, unique in found
        }
        wanted = {
            t.key: _TEXT_TYPES,
            t.text: _TEXT_TYPES,
            t.metadata: _JSON_TYPES,
            t.vector: ("vector",),
        }
        if t.scope_column is not None:
            wanted[t.scope_column] = ()
        plan: BulkPlan | None = None
        if all(name in columns for name in wanted):
            fits = all(not types or columns[name][1] in types for name, types in wanted.items())
            others_filled = all(columns[name][2] for name in columns if name not in wanted)
            unique = bool(columns[t.key][3])
            if fits and others_filled and (unique or t.newest is not None):
                plan = BulkPlan(
                    key_type=columns[t.key][0],
                    text_type=columns[t.text][0],
                    metadata_type=columns[t.metadata][0],
                    vector_type=columns[t.vector][0],
                    scope_type=columns[t.scope_column][0] if t.scope_column else None,
                    unique_key=unique and t.newest is None,
                )
        if plan is None:
            log.info(
                "pbr: %s is not laid out as expected; writes go through the framework", t.qualified
            )
        self._bulk, self._bulk_known = plan, True
        return plan

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
        params = self._user_params(user_id)
        rev, armed = self._read_all(f"SELECT {token_columns(self.table)}", params)[0]
        return _token(rev, armed)

    def read_user(self, user_id: str) -> UserRows | None:
        """Every row of ``user_id`` with its vector, the change token and the user's shared
        derived state (:mod:`pbr_core.derived`), in **one statement**: one round trip, one
        snapshot of the database, so the token is exactly the rows' (a write committed
        meanwhile is either in both or in neither). Rows are put in key order (code points),
        so every worker that reads a user cold builds the same item order. What a worker that
        has never seen the user reads (:meth:`~pbr_core.corpus.Corpus.history`); None where
        this table cannot (no revision trigger, a per-user table, a vector column that is not
        ``vector``): the caller lists instead."""
        if not self.tokens or self.owner is not None:
            return None
        vector = self._vector_select()
        if not vector.endswith(".vector_send(" + quote_ident(self.table.vector) + ")"):
            return None
        t = self.table
        k = quote_ident(t.key)
        distinct, order = self._newest_only()
        state = (
            "s.rev, s.state, NULL::text, NULL::text, NULL::text, NULL::bytea, NULL::text FROM "
            f"(SELECT 1) one LEFT JOIN {t.own('pbr_states')} s ON s.tbl = to_regclass(:tbl) "
            "AND s.reader = :reader AND s.owner = :user"
            if self.states
            else "NULL::bigint, NULL::bytea, NULL::text, NULL::text, NULL::text, NULL::bytea, "
            "NULL::text"
        )
        # The head (token, shared state) and then the rows, unsorted: a server-side sort would
        # carry every row's vector (1.5 kB at 384-d) and spill to disk past work_mem; keys are
        # unique (a primary key, or the newest row per key), so the order is made here.
        statement = (
            f"SELECT 0, {token_columns(t)}, {state} UNION ALL "
            "SELECT 1, NULL, NULL, NULL, NULL, k::text, t, m::text, v, x "
            f"FROM (SELECT {distinct}{k} AS k, {quote_ident(t.text)} AS t, "
            f"{quote_ident(t.metadata)} AS m, {vector} AS v, xmin::text AS x FROM "
            f"{t.qualified} WHERE {t.scoped()} AND {self._mine()}{order}) mine"
        )
        params = self._user_params(user_id, reader=self._reader())
        rows = self._read_all(statement, params)
        heads = [row for row in rows if row[0] == 0]
        if len(heads) != 1:
            raise RuntimeError(f"a user's read returned {len(heads)} head rows, not 1")
        _, rev, armed, state_rev, state = heads[0][:5]
        body = sorted((row[5:] for row in rows if row[0] == 1), key=_by_key)
        # the engine's JSON decoder (create_engine(json_deserializer=...)), as a listing's
        loads = getattr(self.sql, "loads", json.loads)
        metas = loads("[" + ",".join(m or "null" for _, _, m, _, _ in body) + "]")
        parsed = parse_vectors(b"".join(v or b"\x00\x00\x00\x00" for *_, v, _ in body), len(body))
        out = []
        for (key, text, _, _, stamp), meta, vec in zip(body, metas, parsed):
            record = self._record(user_id, *_row(key, text, meta), vec, stamp)
            if record is not None:
                out.append(record)
        token = _token(rev, armed)
        shared = None
        if token is not None and state_rev is not None and state is not None:
            # at the rows' revision: under the token they are read with, else another's
            shared = (token if state_rev == rev else str(state_rev), bytes(state))
        return UserRows(token=token, records=out, state=shared, shares=self.states)

    @property
    def can_score(self) -> bool:
        """Whether :meth:`read_scored` can rank a user in the database: a shared table kept by
        pbr's trigger, whose states this role reads and writes."""
        return self.tokens and self.states and self.owner is None

    def read_scored(self, user_id: str, query: np.ndarray) -> ScoredRows | None:
        """What ranks a user this worker has not read, without bringing their vectors here
        (:mod:`pbr_core.view`), in **one statement** and one snapshot: the change token, the
        user's shared derived state, and every row's key, cosine with the unit ``query``
        (pgvector computes them: one number per row instead of 1.5 kB at 384-d) and row
        version, as one array each, and the text and metadata of each row of at most
        :data:`INLINE_BYTES`. Longer ones are read afterwards, for the rows a request shows
        only (:meth:`_shown`): they made most of the statement's time (1k rows of 1.7 kB
        texts: 8.2 ms with them, 1.0 without).
        None where this table cannot (no revision trigger or shared states, a per-user table,
        a vector column that is not pgvector's ``vector``)."""
        if not self.can_score:
            return None
        self._vector_select()  # looks the column's type up, once: pgvector's schema
        schema = self._vector_schema
        if schema is None:
            return None
        t = self.table
        k, v = quote_ident(t.key), quote_ident(t.vector)
        distinct, order = self._newest_only()
        vector_type = f"{quote_ident(schema)}.vector"
        # NULL (NaN here) where the dimensions differ, instead of an error: the request then
        # reads the rows and says what is wrong as any request does
        cosine = (
            f"CASE WHEN {quote_ident(schema)}.vector_dims({v}) = :dim THEN 1 - ({v} "
            f"OPERATOR({quote_ident(schema)}.<=>) CAST(:q AS {vector_type})) END"
        )
        text, meta = quote_ident(t.text), quote_ident(t.metadata)
        small = (
            f"coalesce(octet_length({text}::text), 0) + coalesce(pg_column_size({meta}), 0) "
            "<= :inline"
        )
        # a short row's text and metadata; a long row's place (ctid), to read them if shown
        # (the size reckoned once per row: OFFSET 0 keeps the inner query whole)
        mine = (
            "SELECT k, c, x, CASE WHEN s THEN NULL ELSE ctid::text END AS i, CASE WHEN s THEN "
            "t0::text END AS t, CASE WHEN s THEN m0::text END AS m FROM (SELECT "
            f"{distinct}{k}::text AS k, {cosine} AS c, xmin::text AS x, ctid, {text} AS t0, "
            f"{meta} AS m0, {small} AS s FROM {t.qualified} WHERE {t.scoped()} AND "
            f"{self._mine()}{order} OFFSET 0) z"
        )
        # The rows in any order (put in key order below); none where no state is shared (the
        # caller reads the user's rows anyway).
        statement = (
            f"SELECT {token_columns(t)}, s.rev, s.state, a.* FROM (SELECT 1) one LEFT JOIN "
            f"{t.own('pbr_states')} s ON s.tbl = to_regclass(:tbl) AND s.reader = :reader "
            "AND s.owner = :user CROSS JOIN LATERAL (SELECT array_agg(k), array_agg(c), "
            f"array_agg(x), array_agg(i), array_agg(t), array_agg(m) FROM ({mine}) r "
            "WHERE s.state IS NOT NULL) a"
        )
        params = self._user_params(
            user_id,
            reader=self._reader(),
            q=QueryVector(query),
            dim=int(np.asarray(query).shape[0]),
            inline=INLINE_BYTES,
        )
        rows = self._scored(statement, params)
        if len(rows) != 1:
            raise RuntimeError(f"a user's scored read returned {len(rows)} rows, not 1")
        rev, armed, state_rev, state, got, cosines, stamps, tids, texts, metas = rows[0]
        token = _token(rev, armed)
        got = got or []
        # In key order (code points, whatever the server's encoding; a NULL key last): the
        # order a cold read builds a history in, so that the rows line up with the state's
        # items (the caller checks). Sorted here: the server sorting the rows with their texts
        # took ~0.4 ms of a 1k-item user's statement, Python takes ~0.1.
        if None in got:
            by_key = sorted(range(len(got)), key=lambda i: (got[i] is None, got[i] or ""))
        else:
            by_key = sorted(range(len(got)), key=got.__getitem__)
        keys = [got[i] for i in by_key]
        in_order = [(stamps or [])[i] for i in by_key]
        at = [(tids or [])[i] for i in by_key]  # where each row version is (ctid)

        def records(positions: Sequence[int]) -> list[Record | None]:
            # a short row's text and metadata came with the scores (no place given); the
            # others are read now
            later = [p for p in positions if at[p] is not None]
            read = (
                dict(zip(later, self._shown(user_id, keys, in_order, at, later))) if later else {}
            )
            out: list[Record | None] = []
            for p in positions:
                if p in read:
                    out.append(read[p])
                    continue
                row = by_key[p]
                out.append(self._text_record(user_id, keys[p], texts[row], metas[row], stamps[row]))
            return out

        at_rows = token is not None and state is not None and state_rev == rev
        return ScoredRows(
            token=token,
            state=bytes(state) if at_rows else None,
            keys=keys,
            cosines=np.array(cosines or [], dtype=np.float64)[by_key],
            stamps=in_order,
            records=records,
        )

    def _shown(
        self,
        user_id: str,
        keys: Sequence[str],
        stamps: Sequence[str],
        tids: Sequence[str],
        positions: Sequence[int],
    ) -> list[Record | None]:
        """The rows at ``positions`` of a scored read's ``keys`` as ``user_id``'s records, in
        one statement: each the very row version the scored read saw (its key and ``xmin``
        among ``stamps``), else None (changed, deleted or not the user's since: the request
        then reads the user's rows, as for any row the view cannot serve).

        Found where the scored read saw them (``tids``: each version's ``ctid``), in pages the
        server has just read: by key, each row cost an index probe, often a page from disk
        (0.7 ms for a request's rows, against 0.3 in a loop where they were cached). The places
        are bound as ``text[]``: asyncpg binds a ``tid`` only from a tuple."""
        wanted = [tids[i] for i in positions if keys[i] is not None and tids[i] is not None]
        found: dict[tuple[str, str], list[tuple[Any, Any]]] = {}
        if wanted:
            t = self.table
            k = quote_ident(t.key)
            statement = (
                f"SELECT {k}::text, {quote_ident(t.text)}::text, {quote_ident(t.metadata)}::text, "
                f"xmin::text FROM {t.qualified} WHERE ctid = ANY(CAST(CAST(:tids AS text[]) AS "
                f"tid[])) AND "
                f"{t.scoped()} AND {self._mine()}"
            )
            params = t.params(user=user_id, tids=list(dict.fromkeys(wanted)))
            for key, text, meta, stamp in self._read_all(statement, params):
                found.setdefault((key, stamp), []).append((text, meta))
        out: list[Record | None] = []
        for i in positions:
            same = found.get((keys[i], stamps[i]), []) if keys[i] is not None else []
            if len(same) != 1:  # gone, rewritten, or two rows of one version: not this row
                out.append(None)
                continue
            text, meta = same[0]
            out.append(self._text_record(user_id, keys[i], text, meta, stamps[i]))
        return out

    def _text_record(
        self, user_id: str, key: str, text: str | None, meta: str | None, stamp: str
    ) -> Record | None:
        """A row read without its vector, its metadata as JSON text (the engine's decoder,
        ``create_engine(json_deserializer=...)``), as ``user_id``'s record (:meth:`_record`)."""
        parsed = getattr(self.sql, "loads", json.loads)(meta or "null")
        return self._record(user_id, *_row(key, text, parsed), None, stamp)

    def _scored(self, statement: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """The rows of :meth:`read_scored`'s ``statement``: through pbr's function of it where
        it exists or can be made (:meth:`_scored_function`), else the statement itself. A
        function call that fails (the function dropped, the table altered) is not tried again
        by this reader: the statement answers from then on. Any other error (a lost
        connection, a timeout, a cancel) is raised as the statement's would be, without a
        second run, and the function is kept."""
        if self._scored_call is None:
            self._scored_call = self._scored_function(statement, params) or ""
        if self._scored_call:
            try:
                return self._read_all(self._scored_call, params)
            except Exception as exc:
                if not _unusable(exc):
                    raise  # the connection, a timeout, a cancel: as the statement's would be
                log.debug("pbr: the scored read's function failed (%s); the statement runs", exc)
                self._scored_call = ""
        return self._read_all(statement, params)

    def _scored_function(self, statement: str, params: Mapping[str, Any]) -> str | None:
        """A call of a PL/pgSQL function running ``statement`` (made here if missing), or None
        where none can be (a role that may not create it, a parameter of another type).

        Why: the server keeps a function's plans for the session, whatever the client does,
        while psycopg forgets its prepared statements at every ``ROLLBACK``, which SQLAlchemy's
        pool sends when an app's ``engine.connect()`` block gives its connection back; the
        statement is then parsed and planned on every request (~0.4 ms of a 1k-item user's,
        docs/performance.md). The function is named by a digest of its text, so a table read
        another way, or another version of the statement, makes another one; it runs with the
        caller's rights (``SECURITY INVOKER``), as the statement would."""
        if not isinstance(self.sql, _EngineSql) or self._vector_schema is None:
            return None  # an app's own Sql callable, or an async engine: the statement
        if any(":" in m.group() or "$" in m.group() for m in _QUOTED.finditer(statement)):
            return None  # a quoted name or literal holding a colon or a dollar sign
        names = list(dict.fromkeys(_PLACEHOLDER.findall(statement)))
        if sorted(names) != sorted(params):
            return None
        types = []
        for name in names:
            value = params[name]
            if isinstance(value, QueryVector):
                types.append(f"{quote_ident(self._vector_schema)}.vector")
            elif isinstance(value, str):
                types.append("text")
            elif isinstance(value, int) and not isinstance(value, bool):
                types.append("bigint")
            else:
                return None
        place = {name: f"${i + 1}" for i, name in enumerate(names)}
        body = _PLACEHOLDER.sub(lambda m: place[m.group(1)], statement)
        signature = ", ".join(types)
        digest = hashlib.sha256(f"{signature}\x00{body}".encode()).hexdigest()[:16]
        name = self.table.own(f"pbr_scored_{digest}")
        columns = (
            "o1 bigint, o2 text, o3 bigint, o4 bytea, o5 text[], o6 float8[], o7 text[], "
            "o8 text[], o9 text[], o10 text[]"
        )
        # the table's columns win over anything the function names (its arguments are
        # positional, its result columns named o1..o10)
        code = f"#variable_conflict use_column\nBEGIN RETURN QUERY {body}; END"
        create = (
            f"CREATE FUNCTION {name}({signature}) RETURNS TABLE({columns}) LANGUAGE plpgsql "
            f"STABLE AS {_dollar_quoted(code)}"
        )
        # made once; two workers making it at once: one of them finds it made
        guarded = "DO " + _dollar_quoted(
            f"BEGIN IF to_regprocedure({quote_literal(f'{name}({signature})')}) IS NULL THEN "
            f"EXECUTE {quote_literal(create)}; END IF; EXCEPTION WHEN duplicate_function OR "
            "unique_violation THEN NULL; END"
        )
        # The function found is pbr's: this very code, with the caller's rights and settings,
        # owned by a role this one is (or the table's owner), so that no other role made it
        # beforehand or may replace it later; and it is called with every argument cast to its
        # type, so that no overload another role adds is chosen instead.
        check = (
            "SELECT p.prosrc, p.prosecdef, p.proconfig IS NULL, l.lanname, "
            "pg_has_role(p.proowner, 'MEMBER') OR p.proowner = (SELECT relowner FROM pg_class "
            "WHERE oid = to_regclass(:tbl)) FROM pg_proc p JOIN pg_language l ON l.oid = "
            "p.prolang WHERE p.oid = to_regprocedure(:sig)"
        )
        sig = {"sig": f"{name}({signature})", "tbl": self.table.regclass}
        try:
            found = self.sql([(guarded, {}), (check, sig)])
        except Exception as exc:
            log.debug("pbr: the scored read runs as a statement (no function: %s)", exc)
            return None
        if [tuple(row) for row in found] != [(f" {code} ", False, True, "plpgsql", True)]:
            log.warning(
                "pbr: %s is not the function pbr makes (or another role owns it); the scored "
                "read runs as a statement",
                name,
            )
            return None
        args = ", ".join(f"CAST(:{n} AS {kind})" for n, kind in zip(names, types))
        return f"SELECT * FROM {name}({args})"

    def write_state(self, user_id: str, token: str, state: bytes) -> bool:
        """Keep ``state`` (:func:`pbr_core.derived.pack`) as ``user_id``'s derived state at
        change token ``token``, for other workers' :meth:`read_user`; written only if the
        user's rows are still at that token (else it would describe other rows). The revision
        row is locked (``FOR SHARE``) while it is written, so a write of the user's rows
        committing meanwhile either waits and then deletes it (the trigger deletes an owner's
        states with every change of its rows) or makes this write find another revision: no
        state outlives the rows it was derived from. Returns whether it was written."""
        rev = _revision(token)
        if not self.tokens or not self.states or self.owner is not None or rev == "none":
            return False
        rows = self.sql(
            [
                (
                    f"INSERT INTO {self.table.own('pbr_states')} (tbl, owner, reader, rev, "
                    f"state) SELECT r.tbl, r.owner, :reader, r.rev, :state FROM "
                    f"{self.table.own('pbr_revisions')} r WHERE "
                    "r.tbl = to_regclass(:tbl) AND r.user_key = :key AND r.owner = :user AND "
                    "r.rev = :rev FOR SHARE "
                    "ON CONFLICT (tbl, owner, reader) DO UPDATE SET rev = EXCLUDED.rev, "
                    "state = EXCLUDED.state RETURNING 1",
                    {
                        "tbl": self.table.regclass,
                        "reader": self._reader(),
                        "user": user_id,
                        "key": self.user_key,
                        "rev": int(rev),  # asyncpg binds a str to a bigint as an error
                        "state": state,
                    },
                )
            ]
        )
        return bool(rows)

    def _read_all(self, statement: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """The rows of a read-only statement: by the driver in binary form where the
        :data:`Sql` can (:meth:`_EngineSql.binary`), else through it."""
        binary = getattr(self.sql, "binary", None)
        rows = binary(statement, params) if binary is not None else None
        return self.sql([(statement, params)]) if rows is None else rows

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

    def _user_params(self, user_id: str, **more: Any) -> dict[str, Any]:
        """The parameters of a statement over ``user_id``'s rows that reads the change token
        (:func:`token_columns`), plus ``more``."""
        return self.table.params(
            tbl=self.table.regclass,
            key=self.user_key,
            user=user_id,
            **self._trigger_names(),
            **more,
        )

    def _trigger_names(self) -> dict[str, str]:
        suffix = self.table.suffix(self.user_key)
        return {"rev": f"pbr_rev_{suffix}", "trunc": f"pbr_trunc_{suffix}"}

    # -- reading -------------------------------------------------------------------------------
    def rows(self, user_id: str, keys: Sequence[str] | None) -> list[tuple[str, str, dict]]:
        """``(key, text, stored metadata)`` of the user's rows (all, or of ``keys``)."""
        return [(k, text, meta) for k, text, meta, _, _ in self._select(user_id, keys, False)]

    def _mine(self) -> str:
        if self.owner is not None:  # a per-user table: every row is its user's
            return "TRUE"
        return f"{self.table.owner_expr(self.user_key)} = :user"

    def _select(
        self, user_id: str, keys: Sequence[str] | None, vectors: bool
    ) -> list[tuple[str, str, dict[str, Any], Any, str]]:
        """``(key, text, metadata, vector or None, the row version's xmin)`` of the user's
        rows (all, or of ``keys``)."""
        t = self.table
        k = quote_ident(t.key)
        vector = self._vector_select() if vectors else "NULL"
        where = f"{t.scoped()} AND {self._mine()}"
        params = t.params(user=user_id)
        if keys is not None:
            where += f" AND {k} = ANY(:keys)"
            params["keys"] = list(keys)
        distinct, order = self._newest_only()
        statement = (
            f"SELECT {distinct}{k}, {quote_ident(t.text)}, {quote_ident(t.metadata)}, {vector}, "
            f"xmin::text FROM {t.qualified} WHERE {where}{order}"
        )
        out = []
        for key, text, meta, vec, stamp in self.sql([(statement, params)]):
            out.append((*_row(key, text, meta), vec, stamp))
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
                self._vector_schema = str(rows[0][0])
                self._vector_sql = f"{quote_ident(rows[0][0])}.vector_send({quote_ident(t.vector)})"
            else:
                self._vector_sql = text_form
        return self._vector_sql

    def _read(self, user_id: str, keys: Sequence[str] | None, *, vectors: bool) -> list[Record]:
        out = []
        for key, text, meta, vec, stamp in self._select(user_id, keys, vectors):
            record = self._record(user_id, key, text, meta, parse_vector(vec), stamp)
            if record is not None:
                out.append(record)
        return out

    def _record(
        self,
        user_id: str,
        key: str,
        text: str,
        meta: Any,
        vector: np.ndarray | None,
        stamp: str | None = None,
    ) -> Record | None:
        """A row as ``user_id``'s record (metadata as the framework reads it back, ``stamp``
        its row version's ``xmin``); None for a row that is not that user's."""
        if self._read_metadata is not None:
            meta = self._read_metadata(key, meta, text)
        record = Record.stored(
            key, text, meta, vector, user_key=self.user_key, owner=self.owner, stamp=stamp
        )
        return record if record is not None and record.user_id == user_id else None

    def _newest_only(self) -> tuple[str, str]:
        """The ``DISTINCT ON`` and ``ORDER BY`` that keep a key's newest row, where the key is
        not unique (LlamaIndex); empty otherwise."""
        t = self.table
        if t.newest is None:
            return "", ""
        k = quote_ident(t.key)
        return f"DISTINCT ON ({k}) ", f" ORDER BY {k}, {quote_ident(t.newest)} DESC"


@contextlib.contextmanager
def transaction(engine: Any) -> Iterator[Any]:
    """A connection of the SQLAlchemy ``engine`` in one transaction, committed at the end and
    rolled back on an error, whatever its connections' autocommit: over an engine made with
    ``isolation_level="AUTOCOMMIT"`` or ``connect_args={"autocommit": True}`` each statement
    would commit on its own (a replacement's delete without its insert; setup's advisory lock
    holding nothing). The connection goes back to the pool as it came."""
    with engine.connect() as conn:
        driver = conn.connection.driver_connection
        was = bool(getattr(driver, "autocommit", False))
        if was:  # idle: the driver opens a transaction at the first statement
            driver.autocommit = False
        try:
            with conn.begin():  # SQLAlchemy commits through the driver in every mode
                yield conn
        finally:
            if was:
                _EngineSql._restore(conn, driver, was)


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
        # how the engine encodes and decodes JSON (create_engine's json_serializer and
        # json_deserializer), for JSON pbr binds or reads as text
        self.dumps = json_dumps_of(engine)
        dialect = getattr(engine, "dialect", None)
        self.loads = getattr(dialect, "_json_deserializer", None) or json.loads

    def __call__(
        self, statements: Sequence[tuple[str, Mapping[str, Any]]]
    ) -> list[tuple[Any, ...]]:
        with transaction(self.engine) as conn:
            return self._run(conn, statements)

    @staticmethod
    def _run(
        conn: Any, statements: Sequence[tuple[str, Mapping[str, Any]]]
    ) -> list[tuple[Any, ...]]:
        """The statements on ``conn``, in its transaction: the last one's rows."""
        from sqlalchemy import text

        rows: list[tuple[Any, ...]] = []
        for statement, params in statements:
            if params:
                bound = _bindable(params, conn.connection.driver_connection)
                result = conn.execute(text(_colons_quoted(statement)), bound)
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
        """One read-only statement (``:name`` placeholders), run by the driver itself with its
        results in PostgreSQL's binary form: a ``bytea`` arrives as bytes, not as hex text to
        decode (a 1.5 MB read: ~1.4 ms instead of ~7), and, one statement being one snapshot,
        outside a transaction (no ``BEGIN`` / ``COMMIT`` round trips, no SQLAlchemy statement
        compilation: what a per-query revision read costs most). None where the driver is not
        psycopg 3, or where a quoted name or literal holds a colon (the placeholders could not
        be told from it): the caller runs it through :meth:`__call__`. A connection lost
        meanwhile is a ``ConnectionError`` (the pool drops it)."""
        converted = self._driver_form(statement, tuple(params))
        if converted is None:
            return None
        with self.engine.connect() as conn:
            driver = conn.connection.driver_connection
            if not hasattr(driver, "pgconn") or not hasattr(driver, "broken"):
                return None  # psycopg2 has no binary results
            if driver.info.transaction_status != _IDLE:
                return None  # a transaction a hook left open: SQLAlchemy's way, not ours
            was = bool(driver.autocommit)  # an engine made with isolation_level="AUTOCOMMIT"
            try:
                if not was:
                    driver.autocommit = True
                bound = _bindable(params, driver)  # before the cursor copies the adapters
                with driver.cursor() as cursor:
                    cursor.execute(converted, bound, binary=True)
                    rows = [tuple(r) for r in cursor.fetchall()]
            except Exception as exc:
                if driver.closed or driver.broken:
                    conn.invalidate()
                    raise ConnectionError(f"the PostgreSQL connection was lost: {exc}") from exc
                raise
            finally:
                self._restore(conn, driver, was)
            return rows

    @staticmethod
    def _restore(conn: Any, driver: Any, was: bool) -> None:
        """Give the pooled connection back as it was lent (its autocommit setting); one that
        cannot be set back is dropped from the pool, never returned changed."""
        if driver.closed or bool(driver.autocommit) == was:
            return
        try:
            driver.autocommit = was
        except Exception:
            conn.invalidate()

    @staticmethod
    @functools.lru_cache(maxsize=256)
    def _driver_form(statement: str, names: tuple[str, ...]) -> str | None:
        """``statement`` with psycopg's ``%(name)s`` placeholders for ``:name`` (each statement
        is converted once); None where a quoted name or literal holds a colon."""
        if not names or any(":" in m.group() for m in _QUOTED.finditer(statement)):
            return None
        pattern = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
        return re.sub(rf"(?<![:\w]):({pattern})\b", r"%(\1)s", statement.replace("%", "%%"))


#: psycopg's ``TransactionStatus.IDLE`` (no transaction open on the connection).
_IDLE = 0

#: A SQL string literal or quoted identifier (a doubled quote inside is part of it).
_QUOTED = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"")


def _colons_quoted(statement: str) -> str:
    """``statement`` for SQLAlchemy's ``text()``: a colon inside a quoted name or literal (a
    ``user_key`` of ``"t :user"``) escaped, so that it is not read as a ``:name`` placeholder."""
    if ":" not in statement:
        return statement
    return _QUOTED.sub(lambda m: m.group().replace(":", "\\:"), statement)


def async_engine_sql(engine: Any, run: Callable[[Any], Any]) -> Sql:
    """:data:`Sql` over a SQLAlchemy ``AsyncEngine``, each call one transaction, driven to
    completion by ``run(coroutine)`` (LangChain's ``PGEngine._run_as_sync``, which runs it on the
    engine's own event loop). Statements without parameters go to the driver connection as they
    are (plpgsql bodies hold ``%`` and ``:``)."""
    from sqlalchemy import text

    async def go(statements: Sequence[tuple[str, Mapping[str, Any]]]) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = []
        async with engine.begin() as conn:
            if not all(params for _, params in statements):
                # asyncpg's adapter opens the transaction at its first statement: a statement
                # sent to the driver before it would run outside it (a setup's advisory lock
                # released at once, its DDL not rolled back with the rest)
                await conn.execute(text("SELECT 1"))
            for statement, params in statements:
                if params:
                    result = await conn.execute(
                        text(_colons_quoted(statement)), _bindable(params, None)
                    )
                    rows = [tuple(r) for r in result] if result.returns_rows else []
                else:
                    raw = await conn.get_raw_connection()
                    await raw.driver_connection.execute(statement)
                    rows = []
        return rows

    def call(statements: Sequence[tuple[str, Mapping[str, Any]]]) -> list[tuple[Any, ...]]:
        return list(run(go(list(statements))))

    return call


def json_dumps_of(engine: Any) -> Callable[[Any], str]:
    """The JSON serializer a SQLAlchemy engine binds JSON values with (``create_engine``'s
    ``json_serializer``; ``json.dumps`` by default)."""
    dialect = getattr(engine, "dialect", None)
    return getattr(dialect, "_json_serializer", None) or json.dumps


def _bindable(params: Mapping[str, Any], driver: Any) -> dict[str, Any]:
    """``params`` as the driver binds them: a :class:`Float4Array` or :class:`QueryVector` in
    binary for psycopg 3 (their dumpers registered on the connection, for those types only); a
    list of floats or pgvector's text form otherwise."""
    out = dict(params)
    for name, value in out.items():
        if isinstance(value, (Float4Array, QueryVector)):
            if _register_binary(driver):
                continue
            out[name] = value.tolist() if isinstance(value, Float4Array) else value.text()
    return out


_DUMPERS: dict[type, Any] = {}


def _register_binary(driver: Any) -> bool:
    """Register the binary :class:`Float4Array` and :class:`QueryVector` dumpers on a psycopg 3
    connection; False for any other driver."""
    module = type(driver).__module__ or ""
    if module.split(".")[0] != "psycopg" or not hasattr(driver, "adapters"):
        return False
    if not _DUMPERS:
        from psycopg.adapt import Dumper
        from psycopg.pq import Format

        class Float4ArrayDumper(Dumper):
            format = Format.BINARY
            # 0 on the class: psycopg files a dumper whose class names a type under that type
            # too, and would send the app's own float4[] (a binary COPY's) through this one
            oid = 0

            def __init__(self, cls: type, context: Any = None) -> None:
                super().__init__(cls, context)
                self.oid = 1021  # float4[], a built-in type: the parameter's type

            def dump(self, obj: Any) -> bytes:
                return obj.binary()

        class QueryVectorDumper(Dumper):
            format = Format.BINARY
            # unknown: the type comes from the statement's cast (pgvector's oid differs from
            # one database to the next)
            oid = 0

            def dump(self, obj: Any) -> bytes:
                return obj.binary()

        _DUMPERS.update({Float4Array: Float4ArrayDumper, QueryVector: QueryVectorDumper})
    for kind, dumper in _DUMPERS.items():
        driver.adapters.register_dumper(kind, dumper)
    return True
