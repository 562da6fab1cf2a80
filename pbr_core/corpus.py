"""One owner for every user's corpus: ids scoped per user, one write path, the host store as truth.

A :class:`Corpus` is the only place where pbr adds, deletes or reads back a user's items. The
framework adapters translate their types into :class:`Record` and call it; they hold no
ownership, id or validation rule of their own.

The rules (the ones a multi-tenant vector database keeps):

* **Ids are scoped per user.** The host store's key of an item is :func:`scoped_key` of
  ``(user_id, item_id)`` (a UUID, accepted by every store); the owner and the user's own id ride
  along in the record's metadata (``user_key`` and :data:`ITEM_ID_KEY`). Two users may use the
  same id; neither can overwrite, read or delete the other's item, because no key of one user
  can be derived from the other's ids, and every read is filtered by owner.
* **Validate everything, then write once.** A batch (any number of users) is checked whole:
  ids, texts, vectors, metadata that must survive persistence and the host's own rules
  (:meth:`HostRecords.validate`). Only then is the host written, in one call. Keys are
  deterministic, so a retry of the same add is an idempotent upsert: a fault mid-write leaves
  records that the next read finds as ordinary items of their user (searchable *and* deletable),
  and the retry overwrites them instead of duplicating them.
* **The host store is the truth where it can list.** What pbr keeps itself (the vectors for the
  anchor and the related history, the anchors) is a cache keyed by each record's revision, a
  hash of its text and metadata. Before a user's history is used, :meth:`Corpus.history` lists
  the user's records in the host (without vectors) and applies the difference: new or changed
  records are fetched (with their vectors where the store returns them, else re-embedded),
  vanished ones dropped. So items deleted through the store itself never reach a prompt, any
  number of worker processes sharing one store behave like one, and wrapping a populated store
  needs no re-adding.
* **Without a host store** (or with one that cannot list) pbr's own :class:`HistoryStore` is the
  record: it is written through the same validation, after the host write succeeded.
* **A bounded cache.** Over a host that lists, the corpus lets its :class:`HistoryStore` evict
  users under its byte budget (``max_cache_bytes``, :meth:`Corpus.release`): an evicted user's
  bookkeeping is forgotten with it, so its next read re-reads it in full from the host. Where
  pbr's history is the record, an explicit budget is refused (it would lose data).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import json
import logging
import os
import queue
import threading
import time
import uuid
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .config import PBRConfig, SearchMode
from .derived import (
    CENTRAL_ITEMS,
    DamagedState,
    OtherVersion,
    attach,
    derive,
    pack,
    rows_digest,
    to_derive,
    unpack,
)
from .errors import UnknownUserError
from .fusion import MODE_TERMS
from .history import HistoryStore
from .hybrid import Ranked, hits, rank
from .items import (
    HistoryItem,
    check_batch,
    check_ids,
    check_one_history,
    check_serialisable,
    copy_metadata,
    id_or_new,
)
from .lexical import DEFAULT_STEMMER, StemmerName
from .protocols import Embedder, SearchHit, model_id_of
from .snapshot import UserHistory
from .vectors import (
    aembed_documents,
    aembed_query,
    as_unit_rows,
    as_unit_vector,
    check_dimension,
    check_model,
    embed_documents,
    embed_query,
)
from .view import NotServed, ScoredView, ranks_in_database, servable
from .windows import Window, split, window_of

__all__ = [
    "ITEM_ID_KEY",
    "RAW_SCORE_KEY",
    "Corpus",
    "HostRecords",
    "Record",
    "ScoredRecord",
    "check_user_id",
    "held_item_id",
    "revision",
    "scoped_key",
    "stored_timestamp",
]

#: Metadata key under which the host store keeps the user's own id of an item.
ITEM_ID_KEY = "pbr_id"
#: Metadata key of the host store's own score (a distance for some stores, e.g. Chroma).
RAW_SCORE_KEY = "store_score"

log = logging.getLogger("pbr.corpus")


class _BackgroundReads:
    """A corpus's own daemon thread that reads users into its cache after a request ranked them
    in the database (:meth:`Corpus.read_later`), and derives and shares users' states after
    writes (:meth:`Corpus.derive_later`). One per corpus, so a read stuck on a dead
    connection holds up no other corpus's; a daemon, so it never keeps the process from
    exiting; it holds its corpus weakly, and ends once the corpus is gone. At most
    :data:`_BACKGROUND_PENDING` users wait: past that a read is dropped (the user's next
    request ranks in the database again; a derivation's user is read whole by the next
    worker new to them)."""

    def __init__(self, corpus: Corpus) -> None:
        self._corpus = weakref.ref(corpus)
        self._queue: queue.Queue[tuple[str, bool] | None] = queue.Queue(maxsize=_BACKGROUND_PENDING)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._unfinished = 0  # jobs queued or under way
        # held while a job runs: a fork waits for the job under way (_before_fork)
        self._gate = threading.Lock()
        self._job_thread: int | None = None  # the thread running a job (a job may fork)
        self._finalizer = weakref.finalize(corpus, self._stop)  # the thread ends with its corpus
        _WORKERS.add(self)

    def _stop(self) -> None:
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)

    def submit(self, user_id: str, derive: bool = False) -> bool:
        """Queue a read of ``user_id`` (``derive``: a derivation); False where too many wait."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="pbr-read-later", daemon=True
                )
                self._thread.start()
            try:
                self._queue.put_nowait((user_id, derive))
            except queue.Full:
                return False
            self._unfinished += 1
        return True

    def wait(self, timeout: float | None) -> bool:
        """Wait until no job is queued or under way; False at ``timeout`` (seconds)."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._unfinished, timeout)

    def _done(self) -> None:
        with self._idle:
            self._unfinished -= 1
            self._idle.notify_all()

    def _run(self) -> None:
        while True:
            try:
                job = self._queue.get(timeout=30.0)
            except queue.Empty:
                if self._corpus() is None:
                    return
                continue
            corpus = self._corpus()
            if corpus is None or job is None:
                return
            user_id, derive = job
            with self._gate:
                self._job_thread = threading.get_ident()
                try:
                    if derive:
                        corpus._derive_now(user_id)
                    else:
                        corpus._read_now(user_id)
                finally:
                    self._job_thread = None
                    self._done()
            del corpus  # not kept alive by this thread while it waits


#: Every corpus's background worker in this process, for the fork handlers.
_WORKERS: weakref.WeakSet[_BackgroundReads] = weakref.WeakSet()
#: One fork at a time through the handlers (two threads may fork at once).
_FORK_LOCK = threading.Lock()
#: The workers whose gate the fork under way holds, and those it could not wait for.
_GATES_HELD: list[_BackgroundReads] = []
_GATES_MISSED: list[_BackgroundReads] = []
#: How long a fork waits for the background jobs under way, in all (seconds): a read takes
#: tens of ms; one stuck on a dead connection is not waited for past this.
_FORK_WAIT_S = 10.0


def _before_fork() -> None:
    """Let no background job be under way while the process forks. A job holds a user's lock
    (and, a moment, the cache's) while it reads; a child would inherit them held, with no
    thread to release them, and hang on that user's requests (a server that preloads its app,
    warms it up and forks its workers). Waits for the jobs under way, not for the queues, at
    most :data:`_FORK_WAIT_S` in all; a job that forks itself is not waited for."""
    _FORK_LOCK.acquire()
    _GATES_HELD.clear()
    _GATES_MISSED.clear()
    deadline = time.monotonic() + _FORK_WAIT_S
    me = threading.get_ident()
    for worker in list(_WORKERS):
        if worker._job_thread == me:
            continue  # this fork is the job's own
        if worker._gate.acquire(timeout=max(0.0, deadline - time.monotonic())):
            _GATES_HELD.append(worker)
        else:
            _GATES_MISSED.append(worker)
    if _GATES_MISSED:
        log.warning(
            "pbr: forking while %d background read(s) of a corpus are still under way after "
            "%.0f s; the child resets those corpora's locks",
            len(_GATES_MISSED),
            _FORK_WAIT_S,
        )


def _after_fork_in_parent() -> None:
    for worker in _GATES_HELD:
        worker._gate.release()
    _GATES_HELD.clear()
    _GATES_MISSED.clear()
    _FORK_LOCK.release()


def _after_fork_in_child() -> None:
    """The child has none of the parent's threads: each corpus starts its background work
    anew (the parent's queued reads and derivations stay the parent's). A corpus whose job
    was not waited for gets new locks, since that job held some and will never release them."""
    missed = list(_GATES_MISSED)
    workers = list(_WORKERS)
    _WORKERS.clear()  # none of their threads exists here
    _after_fork_in_parent()
    for worker in workers:
        worker._finalizer.detach()
        corpus = worker._corpus()
        if corpus is not None and corpus._background is worker:
            corpus._no_background()
            if worker in missed:  # its job held some of the corpus's and the cache's locks
                corpus._new_locks()
                corpus.cache._lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )


#: Users a corpus's background reads may have waiting (:class:`_BackgroundReads`).
_BACKGROUND_PENDING = 256


_NAMESPACE = uuid.UUID("6f1c1f52-3b0e-4d7e-9a55-8a1b3c0e4b21")


def check_user_id(user_id: object) -> str:
    """``user_id`` if it is a non-empty string: the one rule for user ids, core and adapters."""
    if not isinstance(user_id, str) or not user_id:
        raise ValueError(f"user_id must be a non-empty string, got {user_id!r}")
    return user_id


def user_tag(user_id: str) -> str:
    """A user id as logs show it: the first 8 hex digits of its sha256 (never the id itself)."""
    return hashlib.sha256(user_id.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def scoped_key(user_id: str, item_id: str) -> str:
    """The host store key of ``user_id``'s item ``item_id``: a UUID derived from both.

    Deterministic (a retry writes the same key), collision-free across users (the pair is
    JSON-encoded, so no user/id split of one string matches another), and a UUID because some
    stores (Qdrant, Weaviate) accept nothing else.
    """
    return str(uuid.uuid5(_NAMESPACE, json.dumps([user_id, item_id], ensure_ascii=False)))


def held_item_id(key: str | None, metadata: Mapping[str, Any]) -> str | None:
    """The user's id of an item a host store holds already, read back with the ``key`` it is
    held under: the id pbr wrote into its metadata (:data:`ITEM_ID_KEY`; the key is then pbr's
    scoped one, not the user's id), else the key itself (a record written without pbr). One
    rule for recording what a store holds, in both frameworks."""
    own = metadata.get(ITEM_ID_KEY)
    return own if isinstance(own, str) and own else key


def stored_timestamp(metadata: Mapping[str, Any]) -> float | None:
    """An item's timestamp as a store keeps it: ``metadata["timestamp"]``, POSIX seconds where
    it is a number, else none. One rule for reading a store's records and documents back."""
    stamp = metadata.get("timestamp")
    return float(stamp) if isinstance(stamp, (int, float)) else None


@dataclass(frozen=True)
class Record:
    """One item as it is (or will be) in the host store.

    Attributes:
        key: the host store's id (:func:`scoped_key` for records pbr wrote; whatever the store
            used for records written before pbr wrapped it).
        user_id: the owner.
        item_id: the user's own id of the item (what the user sees and deletes by).
        text: the item's text.
        metadata: the item's metadata as the user gave it (no pbr bookkeeping keys).
        vector: the stored embedding, unit norm; None where the store does not return it.
        timestamp: POSIX seconds, or None.
        extra: the adapter's own object for this record (e.g. the node it writes), passed
            through untouched.
        stamp: the host's version of the stored row where it has one (PostgreSQL: the row
            version's ``xmin``), so that a change of the vector alone changes the revision.
    """

    key: str
    user_id: str
    item_id: str
    text: str
    metadata: Mapping[str, Any] = field(default_factory=dict)
    vector: np.ndarray | None = None
    timestamp: float | None = None
    extra: Any = None
    stamp: str | None = None

    @classmethod
    def stored(
        cls,
        key: str,
        text: str,
        metadata: Mapping[str, Any],
        vector: Any = None,
        *,
        user_key: str,
        owner: str | None = None,
        stamp: str | None = None,
    ) -> Record | None:
        """A record as a host store holds it: owner from ``metadata[user_key]`` (else
        ``owner``, for a per-user partition), the user's id from :data:`ITEM_ID_KEY` (else the
        key: a record written before pbr). None for a record nobody owns: pbr never reads it as
        anyone's."""
        user = metadata.get(user_key, owner)
        if not isinstance(user, str) or not user:
            return None
        return cls(
            key=key,
            user_id=user,
            item_id=str(metadata.get(ITEM_ID_KEY, key)),
            text=text,
            metadata={k: v for k, v in metadata.items() if k != ITEM_ID_KEY},
            vector=None if vector is None else np.asarray(vector, dtype=np.float32),
            timestamp=stored_timestamp(metadata),
            stamp=stamp,
        )

    def item(self) -> HistoryItem:
        return HistoryItem(
            id=self.item_id, text=self.text, metadata=self.metadata, timestamp=self.timestamp
        )


@dataclass(frozen=True)
class ScoredRecord:
    """A search result mapped back to its owner's item, with one meaning of score.

    ``hit.score`` is the search mode's score (hybrid: the relevance of
    :func:`pbr_core.hybrid.relevance`; the cosine with the search vector; or BM25: higher is
    better, the same for every store; both legs in ``hit.legs``);
    ``raw_score`` is what the store reported (a distance for Chroma), None when pbr ranked the
    item without a host search (see :meth:`Corpus.search`); the adapter then reads the record
    back by ``key`` if it needs more.
    """

    hit: SearchHit
    key: str
    raw_score: float | None


@runtime_checkable
class HostRecords(Protocol):
    """What pbr needs from a host vector store, in its own terms (the adapters implement it).

    ``can_list`` says whether :meth:`list_user` works; a store that cannot list leaves pbr's own
    history as the record of what each user holds.
    """

    @property
    def can_list(self) -> bool:
        """Whether :meth:`list_user` works."""
        ...

    def validate(self, records: Sequence[Record]) -> None:
        """Raise ``ValueError`` for anything the store would refuse; write nothing."""
        ...

    def upsert(self, records: Sequence[Record]) -> None:
        """Write records (vectors given), replacing records with the same key."""
        ...

    def delete(self, user_id: str, keys: Sequence[str]) -> None:
        """Remove ``user_id``'s records by key; unknown keys are ignored."""
        ...

    def list_user(self, user_id: str) -> list[Record]:
        """Every record owned by ``user_id``, vectors optional (None is fine)."""
        ...

    def fetch(self, user_id: str, keys: Sequence[str]) -> list[Record]:
        """``user_id``'s records by key, with vectors where the store returns them; missing
        keys skipped."""
        ...

    # Optional: ``change_token(user_id) -> str | None``, a value that changes whenever any of
    # the user's records changes (None: cannot tell). With it, a read lists the user only when
    # the token moved (pbr_core.postgres reads it through a trigger-kept revision row).
    # Optional: ``can_score`` and ``read_scored(user_id, q) -> ScoredRows | None``: a user
    # ranked in the database (pbr_core.view; PostgreSQL, pbr_core.postgres).
    # Optional: ``read_user(user_id) -> UserRows | None``, every record with its vector, the
    # change token and the user's shared derived state in one read (what a worker that never saw
    # the user reads; None: list instead), and ``write_state(user_id, token, blob)`` to share
    # the derived state a worker built (pbr_core.postgres, pbr_core.derived).


def revision(record: Record) -> str:
    """A record's revision: a hash of its text, metadata, timestamp and, where the host gives
    one, its row's stamp (PostgreSQL's ``xmin``: a new one with every write of the row, so a
    vector changed alone is seen too); not of the vector itself.

    Cheap to compute from a listing without vectors (about 4 µs a record); a changed item has a
    new revision, so a cached vector is re-read exactly when the item changed. (A store that
    returns a nested metadata value with its keys in another order costs one spurious re-read;
    so does each row this process wrote, read back once with its stamp.)
    """
    payload = f"{record.text}\x00{sorted(record.metadata.items())!r}\x00{record.timestamp!r}"
    if record.stamp is not None:
        payload += f"\x00{record.stamp}"
    return hashlib.blake2b(payload.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def _as_lists(groups: Mapping[str, Iterable[HistoryItem]]) -> dict[str, list[HistoryItem]]:
    """Each group of a write as a list, read once: a group given as a generator is checked,
    embedded and written whole (checking it first consumed it, and nothing was written)."""
    return {user: list(items) for user, items in groups.items()}


def _held(
    groups: Mapping[str, Sequence[HistoryItem]],
    held_keys: Mapping[str, Sequence[str | None]] | None,
) -> dict[tuple[str, str], str]:
    """``held_keys`` as (user, item id) -> key, the unknown ones (None) left out."""
    keys: dict[tuple[str, str], str] = {}
    for user, given in (held_keys or {}).items():
        for item, key in zip(groups.get(user, ()), given):
            if key is not None:
                keys[(user, item.id)] = key
    return keys


@dataclass
class _Group:
    """One user's validated part of a batch."""

    user_id: str
    items: list[HistoryItem]
    vectors: np.ndarray
    extras: list[Any]
    given: bool = False  # the caller gave the vectors (nothing was embedded)

    def __iter__(self) -> Any:
        return iter((self.user_id, self.items, self.vectors, self.extras))


@dataclass
class _Known:
    """What the cache knows of one user's host records: key -> revision, item id -> key, and
    the shadowed keys of an item id listed twice (deleted with it)."""

    revisions: dict[str, str] = field(default_factory=dict)
    key_of: dict[str, str] = field(default_factory=dict)
    shadowed: dict[str, list[str]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # unsaveable key -> revision warned
    token: str | None = None  # the host's change token when this view was listed
    # A snapshot this worker built from a cold read, at that token, whose derived state (anchors,
    # BM25 index) no other worker shared: written back after the request (Corpus.share_state).
    # (history, token, rows' digest, what of it was taken from another worker's state)
    unshared: tuple[UserHistory, str, str, tuple[Any, ...]] | None = None
    # key -> the row's version (PostgreSQL's xmin) as the last cold read read it
    stamps: dict[str, str] = field(default_factory=dict)
    # keys of rows the last cold read found with a vector the database cannot rank (_odd_norms)
    odd_norms: set[str] = field(default_factory=set)


class _ListingMoved(Exception):
    """A listed row was rewritten or deleted before its vector was read: list again."""


#: How often a read lists a user whose rows keep moving under it (:meth:`Corpus._refresh`).
_LISTINGS = 3


#: The range of a stored vector's norm in which pgvector's cosine, summed in float32, is
#: right: the squares of a vector around 1e-25 underflow (its cosine comes out as ±1), of one
#: around 1e20 overflow (0). Reading the rows rescales such a vector exactly.
RANKABLE_NORMS = (1e-12, 1e12)


def _odd_norms(records: Iterable[Record]) -> set[str]:
    """Keys of the rows whose stored vector's norm is outside :data:`RANKABLE_NORMS`: a state
    of a user holding one does not rank them in the database (its users' rows are read)."""
    rows = [r for r in records if r.vector is not None]
    if not rows:
        return set()
    try:
        block = np.stack([np.asarray(r.vector).reshape(-1) for r in rows])
    except ValueError:  # rows of other lengths: none of them is ranked in the database
        return {r.key for r in rows}
    wide = block.astype(np.float64)  # float32 squares are what under- and overflow
    norms = np.sqrt(np.einsum("ij,ij->i", wide, wide))
    low, high = RANKABLE_NORMS
    return {rows[i].key for i in np.flatnonzero(~((norms >= low) & (norms <= high)))}


def _vector_of(record: Record | None) -> Any:
    return None if record is None else record.vector


def _items_by_key(history: UserHistory, known: _Known | None) -> dict[str, str]:
    """Host key -> the user's item id, for the items whose key is not pbr's scoped one: keys
    recorded with the history (an item recorded under its own id, held under the store's key)
    and keys listed or written by this process. A host hit without pbr's id metadata is that
    item; a key in neither is the item of that id (a record written without pbr)."""
    out = {key: item_id for item_id, key in history.host_keys.items()}
    if known is not None:
        out.update((key, item_id) for item_id, key in known.key_of.items())
    return out


class Corpus:
    """Every user's corpus: the one write path, and the verified read path.

    Args:
        host: the host store's records (an adapter's :class:`HostRecords`); None = pbr's own
            store is the record.
        embedder: embeds items the caller gives no vectors for, and items a host store holds
            without returning vectors; None = the embedded all-MiniLM-L6-v2, loaded on first use.
        cache: pbr's per-user histories (vectors, anchors). With a host that can list it is a
            cache verified on every read, bounded by its ``max_cache_bytes``; otherwise it is
            the record, and an explicit ``max_cache_bytes`` is refused (``ValueError``) unless
            it was loaded lazily (its users unchanged since the save go back to their files).
        user_key: the metadata key naming an item's owner, in items and in the host store.
        max_staleness_s: how old (seconds) a verified view of a user may be before the next
            read lists the host again. 0 (default): every read is checked, so another worker's
            write is seen by the next query. A positive value saves the listing (about 2× a
            plain Chroma search for a 1k-item user) on hot users, at the price of seeing other
            workers' writes up to that late; this process's own writes are always seen at once.
    """

    def __init__(
        self,
        host: HostRecords | None = None,
        *,
        embedder: Embedder | None = None,
        cache: HistoryStore | None = None,
        user_key: str = "user_id",
        max_staleness_s: float = 0.0,
    ) -> None:
        if not isinstance(user_key, str) or not user_key:
            raise ValueError("user_key must be a non-empty string")
        if user_key in (ITEM_ID_KEY, "timestamp"):
            # a record's metadata holds its item's id and timestamp under these keys too: the
            # owner would be overwritten by the item's id (another user's items) or its time
            raise ValueError(
                f"user_key {user_key!r} is a metadata key pbr keeps for itself in every record; "
                "name the owner under another key (the default is 'user_id')"
            )
        if not 0.0 <= max_staleness_s < float("inf"):
            raise ValueError(f"max_staleness_s must be finite and >= 0, got {max_staleness_s!r}")
        self.max_staleness_s = float(max_staleness_s)
        self._verified_at: dict[str, float] = {}
        self.embedder = embedder
        self.cache = cache if cache is not None else HistoryStore()
        self.user_key = user_key
        self._known: dict[str, _Known] = {}
        # Users the cache evicted and no read has brought back: a write re-reads them first.
        self._evicted: set[str] = set()
        self._window_of: tuple[object, Window | None] | None = None
        self._new_locks()
        self._no_background()
        self._derive_after_write: PBRConfig | None = None
        self.host = host  # checks the cache's budget against it
        self.check_model()
        self.cache.attach(self)

    def __getstate__(self) -> dict[str, Any]:  # locks are made anew by a copy or an unpickle
        # locks; a tokenizer closure; the requests under way
        skip = (
            "_locks",
            "_write_locks",
            "_locks_guard",
            "_window_of",
            "_in_use",
            "_async_reads",
            "_reading_later",
            "_deriving_later",
            "_background",
        )
        return {k: v for k, v in self.__dict__.items() if k not in skip}

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        if "host" in state:  # pickled before host became a property
            state["_host"] = state.pop("host")
        self.__dict__.update(state)
        self.__dict__.setdefault("_evicted", set())
        self.__dict__.setdefault("_derive_after_write", None)
        self._window_of = None
        self._new_locks()
        self._no_background()
        self.cache.attach(self)

    def _new_locks(self) -> None:
        """This process's locks, made anew (a new corpus, an unpickled one, a forked child
        whose parent's background job held some), and no request under way."""
        self._locks: dict[str, threading.Lock] = {}
        # one add or delete per user at a time (reads do not take it: see _writes_locked)
        self._write_locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        # requests under way per user (in_use): the cache does not evict them meanwhile
        self._in_use: dict[str, int] = {}
        # per user, the async read in a worker thread now (done when it ends): the next async
        # read of the user waits for it on the event loop, not in a thread (ahistory)
        self._async_reads: dict[str, Future[None]] = {}

    def _no_background(self) -> None:
        """No background thread, nothing queued or under way (a new corpus, an unpickled one,
        a forked child)."""
        self._reading_later: set[str] = set()  # users read_later is reading now
        self._deriving_later: set[str] = set()  # users a derivation waits for (derive_later)
        self._background: _BackgroundReads | None = None  # made on the first read_later

    @property
    def host(self) -> HostRecords | None:
        """The host store's records (None: pbr's own history is the record)."""
        return self._host

    @host.setter
    def host(self, host: HostRecords | None) -> None:
        self._host = host
        self.check_budget()

    def check_budget(self) -> None:
        """Refuse an explicit ``max_cache_bytes`` of the cache where it would have to lose
        data: pbr's history is the only record (no host store, or one that cannot list) and the
        cache was not loaded lazily (whose unchanged users can go back to their files).

        Raises:
            ValueError: saying why and what to do instead.
        """
        cache = self.cache
        if not cache.budget_explicit or self.verified or cache.lazy:
            return
        where = (
            "there is no host store"
            if self._host is None
            else f"the host store ({type(self._host).__name__}) cannot list its records"
        )
        raise ValueError(
            f"HistoryStore(max_cache_bytes={cache.max_cache_bytes}) would have to drop users "
            f"that cannot be read back: {where}, so pbr's history is the only record of each "
            "user's items. Leave max_cache_bytes unset (the default budget evicts only users "
            "that can be read back), use a host store that lists its records (e.g. LangChain's "
            "InMemoryVectorStore or Chroma), or load the history lazily "
            "(HistoryStore.load(path, lazy=True, max_cache_bytes=...)): users unchanged since "
            "the save go back to their files"
        )

    def check_model(self) -> None:
        """Refuse an embedder of another model than the vectors the cache holds (a store shared
        with another corpus, e.g. ``store=block.store``, or loaded): queries and new items would
        be compared with vectors of another space. Checked when the corpus is made and before
        every write (a shared store's model is recorded by its first write).

        Raises:
            PersistenceError: naming both models and what to do.
        """
        if self.embedder is not None:  # the default MiniLM too, once resolved
            check_model(self.cache.embedding_model_id, self.embedder, "the history store")

    def can_read_back(self, user_id: str) -> bool:
        """Whether the cache may evict ``user_id`` (:class:`~pbr_core.history.ReadBack`): the
        host lists the user's records, so the next :meth:`history` reads them back."""
        return self.verified

    def release(self, user_id: str) -> bool:
        """Let the cache evict ``user_id`` (:class:`~pbr_core.history.ReadBack`) where no read
        or write of the user is under way: what the corpus knows of the user's records is
        forgotten with it, so the next :meth:`history` re-reads the user in full (vectors from
        the host where it returns them, else re-embedded; windows of long items re-embedded)."""
        if not self.verified:
            return False
        lock = self._user_lock(user_id)
        if not lock.acquire(blocking=False):  # being refreshed or written: keep it
            return False
        try:
            with self._locks_guard:  # one step with in_use's count: a request starts after
                if self._in_use.get(user_id):  # a request reads it more than once: keep it
                    return False
                self._known.pop(user_id, None)
                self._verified_at.pop(user_id, None)
                self._evicted.add(user_id)
        finally:
            lock.release()
        return True

    @contextlib.contextmanager
    def in_use(self, user_id: str) -> Iterator[None]:
        """Keep ``user_id`` in the cache while a request reads it (several times: its history,
        the personalizer's, the ranking's keys). Evicted in between, the request would read
        the user back on the event loop, or rank with keys the eviction forgot."""
        with self._locks_guard:
            self._in_use[user_id] = self._in_use.get(user_id, 0) + 1
        try:
            yield
        finally:
            with self._locks_guard:
                left = self._in_use[user_id] - 1
                if left:
                    self._in_use[user_id] = left
                else:
                    del self._in_use[user_id]

    @property
    def verified(self) -> bool:
        """True when reads are checked against the host store (it can list its records)."""
        return self._host is not None and bool(getattr(self._host, "can_list", False))

    # -- writing -------------------------------------------------------------------------------
    def add(self, user_id: str, items: Sequence[HistoryItem], *, vectors: Any = None) -> list[str]:
        """Add (or replace, by id) one user's items; returns their ids. See :meth:`add_many`."""
        added = self.add_many({user_id: list(items)}, vectors={user_id: vectors})
        return added.get(user_id, [])

    def add_texts(
        self,
        user_id: str,
        texts: Sequence[str],
        *,
        ids: Sequence[str] | None = None,
        metadatas: Sequence[Mapping[str, Any]] | None = None,
        timestamps: Sequence[float | None] | None = None,
    ) -> list[str]:
        """Embed and store texts for a user; returns their ids (a new uuid4 hex where none is
        given, an empty or None entry of ``ids`` included)."""
        return self.add(user_id, items_of_texts(texts, ids, metadatas, timestamps))

    async def aadd_texts(
        self,
        user_id: str,
        texts: Sequence[str],
        *,
        ids: Sequence[str] | None = None,
        metadatas: Sequence[Mapping[str, Any]] | None = None,
        timestamps: Sequence[float | None] | None = None,
    ) -> list[str]:
        """Async :meth:`add_texts` (native async embeddings when they exist)."""
        items = items_of_texts(texts, ids, metadatas, timestamps)
        return (await self.aadd_many({user_id: items})).get(user_id, [])

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        embedder: Embedder | None = None,
        *,
        lazy: bool = False,
        max_cache_bytes: int | None = None,
    ) -> Corpus:
        """A corpus whose record is the store saved at ``path`` (:meth:`HistoryStore.save`);
        refuses an embedder of another model than the saved vectors' (None: the default MiniLM,
        checked by its id). ``lazy=True`` reads each user's files on first use; with it,
        ``max_cache_bytes`` bounds the users in memory (those unchanged since the save go back
        to their files); without it, an explicit budget is refused (see :meth:`check_budget`)."""
        store = HistoryStore.load(path, lazy=lazy, max_cache_bytes=max_cache_bytes)
        check_model(store.embedding_model_id, embedder, str(path))
        if embedder is not None:
            check_dimension(embedder, store.dim, str(path))
        return cls(None, embedder=embedder, cache=store)

    def add_many(
        self,
        groups: Mapping[str, Sequence[HistoryItem]],
        *,
        vectors: Mapping[str, Any] | None = None,
        extras: Mapping[str, Sequence[Any]] | None = None,
        write_host: bool = True,
        held_keys: Mapping[str, Sequence[str | None]] | None = None,
    ) -> dict[str, list[str]]:
        """Add items of several users as one batch: all validated, then one host write.

        Args:
            groups: user id -> that user's items. An item whose id the user already has
                replaces it; another user's items are never touched.
            vectors: user id -> the items' embeddings, where the caller has them; missing
                users are embedded (items whose id and text are cached reuse their vector).
            extras: user id -> one adapter object per item, carried into
                :attr:`Record.extra` for the host's ``validate`` / ``upsert``.
            write_host: False records items the host already holds under their own ids, for a
                host that cannot list; with one that can, nothing is recorded (validated only):
                the next read lists them as the host holds them.
            held_keys: with ``write_host=False``, user id -> the keys the host holds that
                user's items under, one per item (None: not known), where they are not the
                items' ids (a record pbr wrote, read back from the host).

        Raises:
            ValueError / EmbeddingError: anything invalid in any group; nothing is written.
            whatever the host raises: the host write failed; pbr's cache is unchanged and the
                next read reconciles whatever part of the batch landed.
        """
        self.check_model()
        groups = _as_lists(groups)
        self.check_groups(groups)  # every group, before any is embedded
        keys = _held(groups, held_keys)
        return self._commit(self._plan(groups, vectors, extras), write_host=write_host, keys=keys)

    async def aadd_many(
        self,
        groups: Mapping[str, Sequence[HistoryItem]],
        *,
        vectors: Mapping[str, Any] | None = None,
        extras: Mapping[str, Sequence[Any]] | None = None,
        write_host: bool = True,
        held_keys: Mapping[str, Sequence[str | None]] | None = None,
    ) -> dict[str, list[str]]:
        """Async :meth:`add_many`: native async embedding, the host's checks and write in a
        worker thread."""
        self.check_model()
        groups = _as_lists(groups)
        self.check_groups(groups)  # every group, before any is embedded
        todo = {
            user: items
            for user, items in groups.items()
            if (vectors or {}).get(user) is None and items
        }
        given = dict(vectors or {})
        for user, items in todo.items():
            given[user] = await self._aembed(user, items)
        # the plan's host.validate may be I/O too (PostgreSQL reads the keys it would take):
        # off the event loop with the write
        keys = _held(groups, held_keys)
        return await asyncio.to_thread(
            lambda: self._commit(
                self._plan(groups, given, extras), write_host=write_host, keys=keys
            )
        )

    def delete(self, user_id: str, ids: Iterable[str]) -> None:
        """Remove the user's items by their ids.

        Raises:
            KeyError: an id is not one of this user's items (another user's id included);
                nothing is removed.
        """
        check_user_id(user_id)
        ids = check_ids(ids)
        with self._writes_locked([user_id]), self._user_lock(user_id):
            history = self._refresh(user_id) if self.verified else self.cache._current(user_id)
            known = self._known.get(user_id, _Known())
            missing = sorted({i for i in ids if history is None or history.position(i) is None})
            if missing:
                raise KeyError(f"user {user_id!r} has no item(s) {missing}")
            if not ids:
                return
            keys = [self._host_key(user_id, i) for i in dict.fromkeys(ids)]
            if self.host is not None:
                shadows = [k for i in dict.fromkeys(ids) for k in known.shadowed.get(i, [])]
                try:
                    self.host.delete(user_id, keys + shadows)
                except BaseException:  # it may have landed (a reply lost after the commit):
                    self._verified_at.pop(user_id, None)  # the next read lists the host
                    raise
                for item_id in ids:  # forgotten once deleted: a failed delete is retried whole
                    known.shadowed.pop(item_id, None)
            self.cache.delete(user_id, ids)
            for item_id, key in zip(dict.fromkeys(ids), keys):
                known.revisions.pop(key, None)
                known.key_of.pop(item_id, None)
            self._drop_if_empty(user_id)
        self.derive_later(user_id)

    async def adelete(self, user_id: str, ids: Iterable[str]) -> None:
        """Async :meth:`delete` (the host call runs in a worker thread)."""
        await asyncio.to_thread(self.delete, user_id, check_ids(ids))

    def drop_user(self, user_id: str) -> None:
        """Remove every item of the user, in the host store too."""
        history = self.history(user_id)
        if history is None:
            raise UnknownUserError(user_id)
        self.delete(user_id, [item.id for item in history.items])

    # -- reading -------------------------------------------------------------------------------
    def history(self, user_id: str) -> UserHistory | None:
        """The user's current history, checked against the host store; None if they have none.

        The snapshot pbr ranks with, not a copy (a copy per read would cost a request its
        speed): read it, never change it. An item's ``metadata`` is typed ``Mapping`` for that
        reason; a change made through it would change what pbr returns, unrecorded by the host.
        Results (:class:`~pbr_core.protocols.SearchHit`, the adapters' documents and nodes)
        carry copies.
        """
        check_user_id(user_id)
        if not self.verified:
            return self.cache._current(user_id)
        if self._fresh(user_id):
            current = self.cache._current(user_id)
            if current is not None:
                return current
            # None: no history, or evicted since the check (release forgets the check, and
            # cannot run while the user's lock is held): decided under the lock
        with self._user_lock(user_id):
            if self._fresh(user_id):
                return self.cache._current(user_id)
            started = time.monotonic()
            history = self._refresh(user_id)
            self._verified_at[user_id] = started
            return history

    def _fresh(self, user_id: str) -> bool:
        """Whether the user was verified less than ``max_staleness_s`` ago."""
        checked = self._verified_at.get(user_id)
        return checked is not None and time.monotonic() - checked < self.max_staleness_s

    def expire(self, user_ids: Iterable[str]) -> None:
        """Make the next read of each of ``user_ids`` list the host again, whatever
        ``max_staleness_s`` says: for writes that reached the host without passing through this
        corpus but from this process (an adapter forwarding a store's own puts and deletes), so
        that they are seen at once like the corpus's own writes. Call it after the write; a
        listing in flight finishes first (the user's lock), so it cannot re-cache the old view.
        """
        for user_id in user_ids:
            with self._user_lock(user_id):
                self._verified_at.pop(user_id, None)

    async def ahistory(self, user_id: str) -> UserHistory | None:
        """Async :meth:`history`. A host listing, or a read of the user's saved files, is I/O:
        it runs in a worker thread, one per user at a time. A second request for the user waits
        for the first's read on the event loop, not in a thread of asyncio's shared pool: a
        burst of requests for one user whose host is slow parked every thread of that pool
        behind the user's lock, and every other user's requests (their reads, their query
        embeddings) queued behind them."""
        while True:
            if not self._needs_io(user_id):
                return self.history(user_id)
            with self._locks_guard:
                running = self._async_reads.get(user_id)
                if running is None:
                    done: Future[None] = Future()
                    done.set_running_or_notify_cancel()  # a waiter's cancel cannot cancel it
                    self._async_reads[user_id] = done
                    break
            await asyncio.wrap_future(running)  # then look again: it may be fresh now

        def release(_: object = None) -> None:
            """Open the user's gate: when the read ends, and also when it never runs (its
            request cancelled while the read waited for a thread of the pool, or a pool that
            refused it), else every later async read of the user would wait for good."""
            with self._locks_guard:
                if self._async_reads.get(user_id) is done:
                    del self._async_reads[user_id]
            if not done.done():
                done.set_result(None)

        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()  # as asyncio.to_thread: tracing parents survive
        try:
            reading = loop.run_in_executor(None, context.run, self.history, user_id)
        except BaseException:
            release()
            raise
        reading.add_done_callback(release)
        return await reading

    def _needs_io(self, user_id: str) -> bool:
        """Whether :meth:`history` would list the host or read the user's saved files."""
        if self.verified and not (self._fresh(user_id) and user_id in self.cache):
            return True
        return self.cache.needs_read(user_id)

    def users(self) -> list[str]:
        """Users pbr has seen (cached or written); a host may hold more, found on first read."""
        return self.cache.users()

    def search(
        self,
        user_id: str,
        history: UserHistory | None,
        vector: np.ndarray,
        terms: Mapping[str, float],
        k: int,
        *,
        mode: SearchMode = "hybrid",
        found: Sequence[tuple[str | None, Mapping[str, Any], float | None]] | None = None,
        own_terms: Mapping[str, float] | None = None,
        context: float = 0.0,
        stemmer: StemmerName | None = DEFAULT_STEMMER,
    ) -> list[ScoredRecord]:
        """The user's ``k`` best items, ranked by pbr (:func:`pbr_core.hybrid.rank`; ``context``
        and ``stemmer``: :attr:`~pbr_core.config.PBRConfig.lexical_context` and
        :attr:`~pbr_core.config.PBRConfig.lexical_stemmer`).

        Args:
            user_id: whose search it is.
            history: the snapshot the query was personalized with (:meth:`history`).
            vector: the unit search vector ``q*``.
            terms: the lexical query (:func:`pbr_core.hybrid.lexical_terms`).
            own_terms: the user's own words in it (None: ``terms``), which hybrid mode reads
                the lexical leg's weight from.
            k: how many results.
            mode: ``"hybrid"``, ``"dense"`` or ``"lexical"``.
            found: a host search's results ``(store key or None, store metadata, store
                score)``, when
                the host had to search (a view filter pbr cannot evaluate, or a store that cannot
                list): only those items are ranked. None ranks all of the user's items, exactly,
                so an approximate index cannot make an item unreachable (Chroma's HNSW can leave
                live records that ``query()`` never returns: chroma-core/chroma#7758).

        A host result whose owner is not ``user_id`` is dropped (defence in depth: the search
        was filtered by owner already), and so is one the snapshot does not know (written after
        the query started) or a shadowed duplicate of an item.
        """
        if history is None or k <= 0:
            return []
        known = self._known.get(user_id)
        raw: dict[int, tuple[str, float | None]] = {}
        if found is not None:
            by_key: dict[str, str] | None = None
            for key, metadata, score in found:
                if metadata.get(self.user_key) not in (None, user_id):
                    continue
                if key is None and ITEM_ID_KEY not in metadata:
                    continue  # neither the store's key nor the user's id: not an item pbr knows
                if ITEM_ID_KEY in metadata:
                    item_id = str(metadata[ITEM_ID_KEY])
                else:  # a record pbr did not write: its item id is its key, unless recorded
                    # under another id (add_documents(ids=..., add_to_vectorstore=False))
                    if by_key is None:
                        by_key = _items_by_key(history, known)
                    item_id = by_key.get(str(key), str(key))
                pos = history.position(item_id)
                if pos is None or pos in raw:
                    continue
                if key is None:  # the store returned no key: the item's, as pbr knows it
                    key = self.key_of(user_id, item_id)
                elif known is not None and known.key_of.get(item_id, key) != key:
                    continue  # a shadowed duplicate of the item (see _refresh)
                raw[pos] = (key, score)
        # in history order, as when ranking all of the user's items: equal scores keep that
        # order, not the order a store returned its hits in
        candidates = sorted(raw) if found is not None else None
        ranked = rank(
            history,
            vector,
            terms,
            k,
            mode=mode,
            candidates=candidates,
            own_terms=own_terms,
            stemmer=stemmer,
            context=context,
        )
        out: list[ScoredRecord] = []
        for r, hit in zip(ranked, hits(history, ranked)):
            key, score = raw.get(r.position) or (self.key_of(user_id, hit.id), None)
            out.append(ScoredRecord(hit=hit, key=key, raw_score=score))
        return out

    def ranks_all(self, view_filtered: bool) -> bool:
        """Whether a search ranks all of the user's items in pbr (:meth:`search` with no
        ``found``) rather than within a host search's results: when pbr's history is the record
        (no host), or when it is verified against a host that lists and no view filter (which
        only the host can evaluate) narrows the search."""
        return self.host is None or (self.verified and not view_filtered)

    def key_of(self, user_id: str, item_id: str) -> str:
        """The host store's key of the user's item (its scoped key, or the key a record
        written before pbr was listed under); the item id itself without a host."""
        return self._host_key(user_id, item_id) if self.host is not None else item_id

    def _host_key(self, user_id: str, item_id: str) -> str:
        """The key the host holds (or is to hold) the user's item under: as listed or written by
        this process, else, for a host that cannot list, as recorded in the saved history (an
        item recorded with ``write_host=False`` keeps its own key across restarts), else pbr's
        scoped key."""
        known = self._known.get(user_id)
        listed = known.key_of.get(item_id) if known is not None else None
        if listed is not None:
            return listed
        if not self.verified:
            history = self.cache._current(user_id)
            recorded = history.host_keys.get(item_id) if history is not None else None
            if recorded is not None:
                return recorded
        return scoped_key(user_id, item_id)

    def host_metadata(self, user_id: str, item: HistoryItem) -> dict[str, Any]:
        """The metadata a host record of ``item`` carries: the item's, the owner and its id."""
        meta = dict(item.metadata)
        meta[self.user_key] = user_id
        meta[ITEM_ID_KEY] = item.id
        if item.timestamp is not None:
            meta.setdefault("timestamp", item.timestamp)
        return meta

    # -- internals -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _writes_locked(self, user_ids: Iterable[str]) -> Iterator[None]:
        """Hold the write locks of ``user_ids`` (an add or a delete of theirs at a time), taken
        in sorted order (the one order of every multi-user hold, so two batches never wait on
        each other's locks), always before a user's lock, never inside one."""
        with contextlib.ExitStack() as stack:
            for user_id in sorted(set(user_ids)):
                stack.enter_context(self._lock_of(self._write_locks, user_id))
            yield

    def _user_lock(self, user_id: str) -> threading.Lock:
        return self._lock_of(self._locks, user_id)

    def _lock_of(self, locks: dict[str, threading.Lock], user_id: str) -> threading.Lock:
        """``user_id``'s lock in ``locks`` (its reads' or its writes'), made on first use."""
        with self._locks_guard:
            lock = locks.get(user_id)
            if lock is None:
                lock = locks[user_id] = threading.Lock()
            return lock

    def _embed(self, user_id: str, items: list[HistoryItem]) -> np.ndarray:
        known = self.cache.known_vectors(user_id, items)
        todo = [i for i, v in enumerate(known) if v is None]
        fresh = (
            embed_documents(
                self.resolved_embedder(), [items[i].text for i in todo], dim=self.cache.dim
            )
            if todo
            else np.zeros((0, self.cache.dim or 1), dtype=np.float32)
        )
        return merge_vectors(known, todo, fresh)

    async def _aembed(self, user_id: str, items: list[HistoryItem]) -> np.ndarray:
        known = self.cache.known_vectors(user_id, items)
        todo = [i for i, v in enumerate(known) if v is None]
        if not todo:
            return merge_vectors(known, todo, np.zeros((0, 1), dtype=np.float32))
        fresh = await aembed_documents(
            self.resolved_embedder(), [items[i].text for i in todo], dim=self.cache.dim
        )
        return merge_vectors(known, todo, fresh)

    def query_vector(
        self, query: str, given: Sequence[float] | np.ndarray | None = None
    ) -> np.ndarray:
        """The unit vector of ``query``: ``given`` (a caller's embedding of it, checked and
        normalised), else the embedder's, in the stored vectors' dimension where known."""
        if given is not None:
            return as_unit_vector(given, dim=self.cache.dim, what="query_vector")
        return embed_query(self.resolved_embedder(), query, dim=self.cache.dim)

    async def aquery_vector(
        self, query: str, given: Sequence[float] | np.ndarray | None = None
    ) -> np.ndarray:
        """Async :meth:`query_vector` (the embedder's native async call where it has one)."""
        if given is not None:
            return as_unit_vector(given, dim=self.cache.dim, what="query_vector")
        return await aembed_query(self.resolved_embedder(), query, dim=self.cache.dim)

    def resolved_embedder(self) -> Embedder:
        """:attr:`embedder`, or the embedded MiniLM (loaded now) when none was given."""
        if self.embedder is None:  # the embedded MiniLM, loaded only when something needs it
            from .models import default_embedder

            self.embedder = default_embedder()
        return self.embedder

    def _plan(
        self,
        groups: Mapping[str, Sequence[HistoryItem]],
        vectors: Mapping[str, Any] | None,
        extras: Mapping[str, Sequence[Any]] | None = None,
    ) -> list[_Group]:
        """Validate every group (embedding where needed), its items checked already
        (:meth:`check_groups`); nothing is written here."""
        plan: list[_Group] = []
        dim = self.cache.dim
        for user_id, items in groups.items():
            items = list(items)
            if not items:
                continue
            if self.verified:  # kept as every worker reads it back: the metadata checked anew
                items = [self._as_stored(user_id, item) for item in items]
                check_serialisable(user_id, items)
            # pbr's own copy: a caller's later change of a nested value is not pbr's
            items = [replace(item, metadata=copy_metadata(item.metadata)) for item in items]
            given = (vectors or {}).get(user_id)
            rows = self._embed(user_id, items) if given is None else given
            # The history's own rules (duplicate ids, blank text, shape, NaN/zero vectors), run
            # on a scratch store of the same dimension: one set of rules, nothing touched.
            checked = HistoryStore(dim=dim).upsert(user_id, items, rows, checked=True)
            unit = np.array(checked.vectors, dtype=np.float32)
            dim = unit.shape[1]
            extra = list((extras or {}).get(user_id) or [None] * len(items))
            if len(extra) != len(items):
                raise ValueError(f"{len(extra)} extras for {len(items)} items of {user_id!r}")
            plan.append(_Group(user_id, items, unit, extra, given=given is not None))
        if self.host is not None and plan:
            self.host.validate(self._records(plan))
        return plan

    def check_groups(self, groups: Mapping[str, Sequence[HistoryItem]]) -> None:
        """Raise ``ValueError`` unless every group of a write (user id -> items) meets the rules
        an item meets before anything is embedded (an embedder call costs, and may send the
        text to an API) or written: a valid user id; items saveable as given
        (:func:`check_serialisable`: a ``HistoryItem`` of string id and text, metadata a
        mapping JSON holds), the user's own, and no value of their own under pbr's id key.
        :meth:`add_many` runs it first; an adapter that embeds before calling it (LlamaIndex's
        nodes) runs it before embedding."""
        for user_id, items in groups.items():
            check_user_id(user_id)
            self._check_items(user_id, list(items))

    def _check_items(self, user_id: str, items: list[HistoryItem]) -> None:
        check_serialisable(user_id, items)
        check_one_history(items)
        for item in items:
            if item.id == "":
                raise ValueError(
                    f"an item of user {user_id!r} has an empty id: give it one (a LlamaIndex "
                    "node its id_), or leave the id out where pbr makes one (add_texts' ids, a "
                    "LangChain Document's id)"
                )
            owner = item.metadata.get(self.user_key)
            if owner is not None and owner != user_id:
                raise ValueError(
                    f"item {item.id!r} belongs to user {owner!r} (its "
                    f"metadata[{self.user_key!r}]), not to user {user_id!r}: add it for "
                    f"{owner!r}, or drop that metadata key"
                )
            if ITEM_ID_KEY in item.metadata and item.metadata[ITEM_ID_KEY] != item.id:
                raise ValueError(
                    f"item {item.id!r}: metadata key {ITEM_ID_KEY!r} is pbr's (the item's "
                    "own id in the host store); rename that metadata key"
                )

    def _as_stored(self, user_id: str, item: HistoryItem) -> HistoryItem:
        """``item`` as a host that lists gives it back (:meth:`Record.stored`): the owner and
        the timestamp in its metadata, the timestamp read from there. What this worker keeps,
        so that it returns what a worker reading the user cold (or after an eviction) returns.

        Raises:
            ValueError: ``metadata["timestamp"]`` and ``timestamp`` disagree (the host keeps
                one, in that key).
        """
        meta = self.item_metadata(self.host_metadata(user_id, item))
        timestamp = stored_timestamp(meta)
        if item.timestamp is not None and timestamp != item.timestamp:
            raise ValueError(
                f"item {item.id!r} of user {user_id!r}: metadata['timestamp'] = "
                f"{meta.get('timestamp')!r} and "
                f"timestamp = {item.timestamp!r} disagree; give one of them (a host store "
                "keeps the timestamp in that metadata key)"
            )
        if meta == item.metadata and timestamp == item.timestamp:
            return item
        return HistoryItem(id=item.id, text=item.text, metadata=meta, timestamp=timestamp)

    def _records(
        self,
        plan: list[_Group],
        *,
        held: bool = False,
        held_keys: Mapping[tuple[str, str], str] | None = None,
    ) -> list[Record]:
        """The host records of ``plan``; ``held``: the host holds them already, under the keys
        ``held_keys`` gives ((user, item id) → key), else, for a record pbr wrote (its metadata
        names its id, :data:`ITEM_ID_KEY`), under pbr's scoped key, else under the item's own
        id (a record written before pbr)."""
        held_keys = held_keys or {}
        records: list[Record] = []
        for user_id, items, unit, extras in plan:
            for item, vector, extra in zip(items, unit, extras):
                if not held:
                    key = self._host_key(user_id, item.id)
                elif (user_id, item.id) in held_keys:
                    key = held_keys[(user_id, item.id)]
                elif item.metadata.get(ITEM_ID_KEY) == item.id:  # one pbr wrote: its key
                    key = scoped_key(user_id, item.id)
                else:
                    key = item.id
                records.append(
                    Record(
                        key=key,
                        user_id=user_id,
                        item_id=item.id,
                        text=item.text,
                        metadata=self.host_metadata(user_id, item),
                        vector=vector,
                        timestamp=item.timestamp,
                        extra=extra,
                    )
                )
        return records

    def _commit(
        self,
        plan: list[_Group],
        *,
        write_host: bool = True,
        keys: Mapping[tuple[str, str], str] | None = None,
    ) -> dict[str, list[str]]:
        out = {g.user_id: [item.id for item in g.items] for g in plan}
        if not plan or (not write_host and self.verified):
            # Records the host holds already, over a host that lists: it is the truth, and the
            # next read lists them as they are there. Nothing is recorded: the ids given are
            # not taken as keys (another user's key would become this user's to overwrite).
            return out
        by_user: dict[str, list[Record]] = {}
        # Embedded before the host write: an embedder's fault then leaves nothing written (over
        # a host that cannot list, a record pbr's history does not hold could not be deleted).
        # Vectors given to a corpus without an embedder of its own are of a model pbr does not
        # know: it cannot embed their windows alike, and loads no default model to try (which
        # would also be recorded as the store's model).
        windows = {
            g.user_id: {}
            if g.given and self.embedder is None
            else self._windows(g.user_id, g.items)
            for g in plan
        }
        # The users' write locks from the host write to the cache's update: a delete of one of
        # these items runs wholly before or after, never between (it would be undone in the
        # cache). Reads take no write lock: they never wait for the host write.
        with self._writes_locked(g.user_id for g in plan):
            if self.host is not None:
                records = self._records(plan, held=not write_host, held_keys=keys)
                if write_host:
                    try:  # the one write; a fault leaves the cache as it was
                        self.host.upsert(records)
                    except BaseException:  # some of it may have landed: the next read of each
                        self.expire(g.user_id for g in plan)  # user lists the host
                        raise
                for record in records:
                    by_user.setdefault(record.user_id, []).append(record)
            # the model that embedded the items: a configured one or the default MiniLM (a load
            # with another model is then refused, as for any recorded model)
            if self.cache.embedding_model_id is None and self.embedder is not None:
                self.cache.embedding_model_id = model_id_of(self.embedder)
            # A host that cannot list: pbr's history is the only record of a key other than pbr's
            # own, so it is saved with the items (HistoryStore host_keys).
            own_keys: dict[str, dict[str, str]] = {}
            if self.host is not None and not self.verified:
                for record in records:
                    if record.key != scoped_key(record.user_id, record.item_id):
                        own_keys.setdefault(record.user_id, {})[record.item_id] = record.key
            for user_id, items, unit, _ in plan:
                with self._user_lock(user_id):
                    if user_id in self._evicted and self.verified:
                        self._refresh(user_id)  # the rest of the user first: no partial view
                    self.cache.upsert(  # the plan's items, checked
                        user_id, items, unit, windows[user_id], own_keys.get(user_id), checked=True
                    )
                    if self.host is not None:
                        known = self._known.setdefault(user_id, _Known())
                        for record in by_user[user_id]:
                            known.key_of[record.item_id] = record.key
                            known.revisions[record.key] = revision(self._as_listed(record))
        if write_host:
            for group in plan:
                self.derive_later(group.user_id)
        return out

    def _as_listed(self, record: Record) -> Record:
        """``record`` as the host lists it back (pbr's bookkeeping keys stripped)."""
        return Record(
            key=record.key,
            user_id=record.user_id,
            item_id=record.item_id,
            text=record.text,
            metadata=self.item_metadata(record.metadata),
            timestamp=record.timestamp,
        )

    def item_metadata(self, stored: Mapping[str, Any]) -> dict[str, Any]:
        """A host record's metadata as the item's (pbr's bookkeeping key removed)."""
        return {k: v for k, v in stored.items() if k != ITEM_ID_KEY}

    def _refresh(self, user_id: str) -> UserHistory | None:
        """Bring the cache of ``user_id`` in line with the host's listing (lock held). A row
        rewritten between the listing and the read of its vector (:class:`_ListingMoved`)
        makes the user listed again, up to :data:`_LISTINGS` times; the last time its new
        vector is taken with the listed text, and the next read, seeing the row's new
        revision, reads it again."""
        for attempt in range(1, _LISTINGS + 1):
            try:
                return self._refresh_listing(user_id, strict=attempt < _LISTINGS)
            except _ListingMoved:
                continue
        raise AssertionError("unreachable")

    def _refresh_listing(self, user_id: str, *, strict: bool) -> UserHistory | None:
        assert self.host is not None
        self._evicted.discard(user_id)
        known = self._known.setdefault(user_id, _Known())
        # A host with a change token (pbr_core.postgres) says cheaply whether anything of the
        # user changed since the last listing; read before listing, so a change made meanwhile
        # leaves a token that differs next time.
        cold = not known.revisions and user_id not in self.cache
        read_user = getattr(self.host, "read_user", None) if cold else None
        rows = read_user(user_id) if read_user is not None else None
        if rows is not None:  # a worker that never saw the user: rows, token, state at once
            token = rows.token
            listed = [r for r in rows.records if r.user_id == user_id]
        else:
            token_of = getattr(self.host, "change_token", None)
            token = token_of(user_id) if token_of is not None else None
            if (
                token is not None
                and token == known.token
                and (user_id in self.cache) == bool(known.revisions)
            ):
                return self.cache._current(user_id)
            listed = [r for r in self.host.list_user(user_id) if r.user_id == user_id]
        known.token = None  # set again only once this listing is applied
        current: dict[str, Record] = {}
        twice: dict[str, list[Record]] = {}
        for record in listed:
            if current.setdefault(record.item_id, record) is not record:
                twice.setdefault(record.item_id, [current[record.item_id]]).append(record)
        shadowed: dict[str, list[str]] = {}
        for item_id, records in twice.items():
            # A user's id listed twice (a record written before pbr and one pbr wrote): the
            # scoped key wins, the other is shadowed, and deleting the id deletes both.
            scoped = scoped_key(user_id, item_id)
            records.sort(key=lambda r: (r.key != scoped, r.key))
            current[item_id] = records[0]
            shadowed[item_id] = [r.key for r in records[1:]]
        known.shadowed = shadowed
        revisions = {r.key: revision(r) for r in current.values()}
        # Unchanged only if the cache holds the user exactly when the host lists records: a
        # loaded save knows no revisions yet, so a user the host no longer lists must still go
        # through the stale-removal below, not be served from the save.
        if revisions == known.revisions and (user_id in self.cache) == bool(revisions):
            known.token = token
            return self.cache._current(user_id)
        history = self.cache._current(user_id)
        changed = [
            r
            for r in current.values()
            if known.revisions.get(r.key) != revisions[r.key]
            or history is None
            or history.position(r.item_id) is None
        ]
        changed, items, left_out = self._saveable(user_id, changed, known)
        if changed:  # I/O (a fetch, an embedding) before the cache changes: a fault changes none
            changed, items, vectors, unusable = self._usable_vectors(
                user_id, changed, items, known, strict=strict
            )
            left_out += unusable
            windows = self._windows(user_id, items)
        for item_id in left_out:  # a new version left out: the old one must go too
            current.pop(item_id, None)
        stale = [it.id for it in history.items if it.id not in current] if history else []
        with self.cache._lock:  # one step for readers: never the stale items gone, the new not in
            if stale:
                self.cache.delete(user_id, stale)
            if changed:
                self.cache.upsert(user_id, items, vectors, windows, checked=True)
        known.revisions = revisions
        known.key_of = {item_id: r.key for item_id, r in current.items()}
        known.token = token
        self._drop_if_empty(user_id)
        history = self.cache._current(user_id)
        if rows is not None:
            known.stamps = {r.key: r.stamp for r in current.values() if r.stamp is not None}
            known.odd_norms = _odd_norms(current.values())
        if rows is not None and rows.shares and history is not None and token is not None:
            self._take_state(history, token, rows.state, known)
        return history

    @staticmethod
    def _basis(history: UserHistory, known: _Known) -> str:
        """A digest of the rows ``history`` was built from, in its order: each item's id, host
        key, revision (text, metadata, timestamp) and vector. What a shared derived state must
        have been derived from to be taken (:mod:`pbr_core.derived`)."""
        digest = hashlib.blake2b(digest_size=16)
        parts: list[str] = []
        for item in history.items:
            key = known.key_of.get(item.id, "")
            parts += (item.id, key, known.revisions.get(key, ""))
        digest.update("\x00".join(parts).encode("utf-8", "surrogatepass") + b"\x00")
        digest.update(np.ascontiguousarray(history.vectors, dtype=np.float32).tobytes())
        return digest.hexdigest()

    def _take_state(
        self,
        history: UserHistory,
        token: str,
        state: tuple[str, bytes] | None,
        known: _Known,
    ) -> None:
        """Give a cold-built ``history`` the derived state another worker shared at the same
        token, of the same rows; else remember to share ours after the request
        (:meth:`share_state`)."""
        basis = self._basis(history, known)
        if state is not None and state[0] == token:
            try:
                attach(history, state[1], basis)
            except OtherVersion as exc:  # after an upgrade, once per user: not worth a warning
                log.debug(
                    "pbr: the shared derived state of user %s is another version's (%s); "
                    "rebuilt and shared again",
                    user_tag(history.user_id),
                    exc,
                )
            except DamagedState as exc:
                log.warning(
                    "pbr: the shared derived state of user %s is not usable (%s); rebuilt "
                    "from the rows and shared again",
                    user_tag(history.user_id),
                    exc,
                )
        # shared after the request if it built more than it took (another anchor, the index)
        known.unshared = (history, token, basis, _derived(history))

    # -- a cold user ranked in the database (pbr_core.view) ------------------------------------
    #: Whether a user this worker has not read is ranked in the database where the host can
    #: (:meth:`read_view`); False reads the user's rows first, as every other store does.
    rank_cold_in_database: bool = True

    def may_view(self, user_id: str) -> bool:
        """Whether :meth:`read_view` may serve ``user_id`` now: a host that scores in the
        database, a user this worker has not read (nor cached), so their rows would be read."""
        if not self.rank_cold_in_database or not self.verified:
            return False
        if not getattr(self._host, "can_score", False) or user_id in self.cache:
            return False
        known = self._known.get(user_id)
        return known is None or not known.revisions

    def read_view(
        self,
        user_id: str,
        q: np.ndarray,
        config: Any,
        anchor_key: Any,
        terms: Mapping[str, float] | None = None,
        k: int = 0,
    ) -> ScoredView | None:
        """``user_id``'s items scored against the unit query vector ``q`` in the database, with
        the derived state another worker shared at exactly these rows (:mod:`pbr_core.view`);
        None where that cannot serve a request of ``config`` (no state at the rows' change
        token, rows the state does not describe, an analyzer or anchor it does not hold, a
        windowed item): the caller reads the user's rows instead. The texts of the items the
        request will likely show (its related items; with the query's words ``terms`` and its
        ``k``, its likely results) are read here too, in one statement
        (:meth:`ScoredView.likely_shown`)."""
        read = getattr(self._host, "read_scored", None)
        rows = read(user_id, q) if read is not None else None
        if rows is None or rows.token is None or rows.state is None:
            return None
        try:
            state = unpack(rows.state, one_request=True)
        except DamagedState:  # the cold read that follows warns where it is damaged
            return None
        if state.user_id != user_id or state.rows is None or state.dim != q.shape[0]:
            return None
        if state.token != rows.token:  # a revision the trigger did not see move (disabled)
            return None
        if state.window != self._window_tokens():
            return None  # this worker's embedder would window other items
        if not servable(state, config, anchor_key):
            return None
        # exactly the rows (keys and versions, in the items' order: the code-point key order
        # both the statement and a cold read use) the state was derived from: a row added, removed,
        # left out, shadowed or rewritten unseen (a partition's trigger disabled meanwhile)
        # is not served; the rows are then read
        if len(rows.keys) != len(state.ids) or None in rows.keys:  # a row without a key
            return None
        if state.rows != rows_digest(rows.keys, rows.stamps):
            return None
        if not np.isfinite(rows.cosines).all():
            return None

        def load(positions: Sequence[int]) -> list[HistoryItem | None]:
            return [
                None if record is None or record.item_id != state.ids[pos] else record.item()
                for pos, record in zip(positions, rows.records(positions))
            ]

        view = ScoredView(state, q, rows.keys, rows.cosines, load)
        # read here, in the step that reads the host: a result not among them is read by a
        # step of its own
        words = terms if terms and config.search != "dense" else {}
        likely = view.likely_shown(config.k1, words, k, config.lexical_stemmer)
        try:
            view.items.many(likely, read=True)
        except NotServed:
            return None
        return view

    def view_results(self, view: ScoredView, ranked: Sequence[Ranked]) -> list[ScoredRecord]:
        """``ranked`` (over ``view``) as search results, as :meth:`search` gives them."""
        return [
            ScoredRecord(hit=hit, key=view.keys[r.position], raw_score=None)
            for r, hit in zip(ranked, hits(view, ranked))  # type: ignore[arg-type]
        ]

    def read_later(self, user_id: str) -> None:
        """Read ``user_id``'s rows into the cache in the background (after a request ranked
        them in the database), so that the user's next request is served warm; at most one
        such read per user at a time, in this corpus's own thread (:class:`_BackgroundReads`).
        Never raises: a failed read leaves the next request ranking in the database again
        (logged at debug level)."""
        self._later(user_id, self._reading_later, derive=False)

    @property
    def derive_after_write(self) -> PBRConfig | None:
        """The request configuration whose derived state (the anchor of its graph parameters,
        the BM25 index of its analyzer) this worker derives and shares after each write of a
        user's rows through it, in the background (:meth:`derive_later`), where the host ranks
        in the database: a write removes the user's shared state, so the next worker new to the
        user would read all their rows. None (the default): shared by the next request that
        reads the user cold. Costs the writer a cold read and the derivation per written user.

        Raises (when set):
            TypeError: not a :class:`~pbr_core.PBRConfig` (nor None).
            ValueError: a configuration whose requests are not ranked in the database (an LLM
                term, a re-rank, neighbour context, ``top_anchor_items`` above the central
                items a state keeps), or that derives nothing (plain fusion with dense
                search): the writer would pay for a state no request uses.
        """
        return self._derive_after_write

    @derive_after_write.setter
    def derive_after_write(self, config: PBRConfig | None) -> None:
        if config is not None:
            _check_derivable(config, "derive_after_write", "a PBRConfig or None")
        self._derive_after_write = config

    def derive_states(self, config: PBRConfig, user_ids: Iterable[str]) -> list[str]:
        """Derive and share, now and in this thread, the state requests of ``config`` rank
        from (the anchor of its graph parameters, the BM25 index of its analyzer) for each of
        ``user_ids``, where the host ranks in the database: for rows written without pbr (a
        load by SQL, another app) or before :attr:`derive_after_write` was set, so that each
        user's first request on a worker new to them is ranked in the database instead of
        reading all their rows (about 3× against 13-19× the plain search at 1k items,
        docs/performance.md). Each user is read as a new worker reads them, by a corpus of its
        own (this corpus's cache is left as it is): one cold read per user (30-50 ms at 1k
        items, 384-d). Returns the users whose state was written; not: a user without rows, one
        whose state for ``config`` was already shared at their rows' version, one with an item
        longer than the embedder reads (never ranked in the database), one whose rows changed
        while they were read (the next cold read shares anew), one the host could not read
        (a warning each).

        Raises:
            TypeError, ValueError: ``config`` as :attr:`derive_after_write` refuses it.
            ValueError: a host that keeps no shared states (PostgreSQL tables pbr set up do);
                a user id that is not a non-empty string (when it comes up: the users before
                it are done).
        """
        _check_derivable(config, "derive_states")
        if not self.verified or not getattr(self._host, "can_score", False):
            raise ValueError(
                "derive_states: this host keeps no shared derived states (a PostgreSQL table "
                "with pbr's revision trigger and pbr_states does; see docs/deployment.md)"
            )
        if isinstance(user_ids, str):
            raise TypeError("derive_states takes an iterable of user ids, not one string")
        shared: list[str] = []
        for user_id in user_ids:
            if self._derive_one(check_user_id(user_id), config, failures=logging.WARNING):
                shared.append(user_id)
        return shared

    def join_background(self, timeout: float | None = None) -> bool:
        """Wait until this corpus's background work (cache fills after requests ranked in the
        database, derivations after writes) is done; True when it is, False at ``timeout``
        (seconds; None: no limit). A job that writes through pbr and then exits calls it
        first: the background thread is a daemon, and a derivation cut short only costs the
        next worker new to the user a read of all their rows."""
        background = self._background
        return True if background is None else background.wait(timeout)

    def derive_later(self, user_id: str) -> None:
        """After a write of ``user_id``'s rows: derive and share their state for
        :attr:`derive_after_write` in the background (:meth:`_derive_now`), where it is set and
        the host ranks in the database; one waiting derivation per user (it reads the rows as
        they are when it starts). Never raises: a failed read is logged at debug level, a
        failed sharing write as a warning (as any worker's), and the next worker new to the
        user reads their rows."""
        if self.derive_after_write is not None and getattr(self._host, "can_score", False):
            self._later(user_id, self._deriving_later, derive=True)

    def _later(self, user_id: str, pending: set[str], *, derive: bool) -> None:
        """Queue ``user_id`` for this corpus's background thread unless ``pending`` (the users
        queued or under way of that kind) holds them."""
        with self._locks_guard:
            if user_id in pending:
                return
            pending.add(user_id)
            if self._background is None:
                self._background = _BackgroundReads(self)
            background = self._background
        try:
            queued = background.submit(user_id, derive)
        except Exception as exc:  # e.g. no thread can be started now: the read is a cache fill
            log.debug("pbr: background work on user %s not started: %s", user_tag(user_id), exc)
            queued = False
        if not queued:
            with self._locks_guard:
                pending.discard(user_id)

    def _read_now(self, user_id: str) -> None:
        """:meth:`read_later`'s read, in the background thread."""
        try:
            self.history(user_id)
        except Exception as exc:
            log.debug("pbr: background read of user %s failed: %s", user_tag(user_id), exc)
        finally:
            with self._locks_guard:
                self._reading_later.discard(user_id)

    def _derive_now(self, user_id: str) -> None:
        """:meth:`derive_later`'s derivation, in the background thread (:meth:`_derive_one` with
        :attr:`derive_after_write`)."""
        with self._locks_guard:
            self._deriving_later.discard(user_id)  # a write from now on queues another
        config = self.derive_after_write
        if config is not None:
            self._derive_one(user_id, config)

    def _derive_one(self, user_id: str, config: PBRConfig, failures: int = logging.DEBUG) -> bool:
        """Read ``user_id`` as a worker new to them would (a corpus of its own: the rows in key
        order, their versions, the change token; this corpus's cache is left as it is), build
        the anchor and BM25 index a request of ``config`` builds, and share them; whether a
        state was written. A user with an item longer than the embedder reads is left
        (:class:`_StateReader`). Never raises: a failure is logged at level ``failures``."""
        try:
            reader = _StateReader(self._host, embedder=self.embedder, user_key=self.user_key)
            history = reader.history(user_id)
            if history is None:
                return False
            derive(history, config, *to_derive(history, config, ranks=True))
            return reader._share(user_id)
        except _Windowed:
            return False  # a state with windows never ranks in the database
        except Exception as exc:
            log.log(
                failures, "pbr: the state of user %s was not derived: %s", user_tag(user_id), exc
            )
            return False

    def has_unshared(self, user_id: str) -> bool:
        """Whether :meth:`share_state` has something to write for ``user_id``."""
        known = self._known.get(user_id)
        return known is not None and known.unshared is not None

    def share_state(self, user_id: str) -> None:
        """Share what this worker derived for a user it read cold (anchors, BM25 index built
        by the request that just ran) with the other workers, through the host
        (``write_state``): the next worker to read the user cold takes it instead of rebuilding.
        Called after each request; does nothing otherwise. Never raises: the state is a cache,
        and a failed write (a read-only role, a lost connection) only costs the next cold worker
        the rebuild (logged)."""
        self._share(user_id)

    def _share(self, user_id: str) -> bool:
        """:meth:`share_state`; whether a state was written."""
        known = self._known.get(user_id)
        unshared = known.unshared if known is not None else None
        write = getattr(self.host, "write_state", None)
        if unshared is None or write is None:
            return False
        assert known is not None
        with self._user_lock(user_id):
            if known.unshared is not unshared:
                return False
            known.unshared = None
            stamp_of, known.stamps = known.stamps, {}  # read for this only
            history, token, basis, taken = unshared
            if known.token != token or self.cache._current(user_id) is not history:
                return False  # changed since: the next cold read derives and shares anew
            if _derived(history) == taken:
                return False  # nothing built beyond what was read
            keys = [known.key_of.get(item.id) for item in history.items]
            # with the rows' keys and versions (a key column that is not unique is outside
            # what a view serves: pack leaves them out) and token, a state also ranks the user
            # in the database
            stamps = [stamp_of.get(key) for key in keys if key is not None]
            odd, known.odd_norms = known.odd_norms, set()
            if None in keys or None in stamps or len(stamps) != len(keys) or odd & set(keys):
                keys = stamps = None  # type: ignore[assignment]
        try:
            blob = pack(history, basis, keys, stamps, token, self._window_tokens())  # type: ignore[arg-type]
            return blob is not None and bool(write(user_id, token, blob))
        except Exception as exc:  # a cache write: the query it follows already succeeded
            log.warning(
                "pbr: could not share the derived state of user %s (%s: %s); other workers "
                "rebuild it",
                user_tag(user_id),
                type(exc).__name__,
                str(exc).splitlines()[0] if str(exc) else "",
            )
            return False

    def _saveable(
        self, user_id: str, records: list[Record], known: _Known
    ) -> tuple[list[Record], list[HistoryItem], list[str]]:
        """The records pbr can keep with their items, and the item ids of those it cannot: one
        without text (nothing to rank: an image node, an empty document written to the host by
        someone else) or one it could not save (a lone surrogate) is left out of the history,
        with one warning per record revision, instead of failing every read of the user."""
        items = [record.item() for record in records]
        try:  # the usual case: every record can be kept (one check for all)
            check_serialisable(user_id, items)
            if not all(item.text.strip() for item in items):
                raise ValueError("a record without text")
        except ValueError:
            pass
        else:
            for record in records:
                known.skipped.pop(record.key, None)
            return list(records), items, []
        kept: list[Record] = []
        kept_items: list[HistoryItem] = []
        left_out: list[Record] = []
        for record, item in zip(records, items):
            try:
                check_serialisable(user_id, [item])
            except ValueError:
                why = "cannot be saved (text, id or metadata not UTF-8 / JSON)"
            else:
                why = "" if item.text.strip() else "has no text (nothing to rank)"
            if why:
                left_out.append(record)
                self._leave_out(user_id, record, known, why)
                continue
            known.skipped.pop(record.key, None)
            kept.append(record)
            kept_items.append(item)
        return kept, kept_items, [record.item_id for record in left_out]

    @staticmethod
    def _leave_out(user_id: str, record: Record, known: _Known, why: str) -> None:
        """Warn, once per revision of ``record``, that it is left out of the history."""
        seen = revision(record)
        if known.skipped.get(record.key) != seen:
            known.skipped[record.key] = seen
            log.warning(
                "pbr: a host record of user %s %s and is left out of the history; rewrite it "
                "or delete it through the store",
                user_tag(user_id),
                why,
            )

    def _usable_vectors(
        self,
        user_id: str,
        records: list[Record],
        items: list[HistoryItem],
        known: _Known,
        *,
        strict: bool = False,
    ) -> tuple[list[Record], list[HistoryItem], np.ndarray, list[str]]:
        """The records whose vectors pbr can rank with (:meth:`_vectors_of`), their items and
        unit vectors, and the item ids of those left out: a stored vector with NaN or inf or
        all zeros (written to the host by someone else) is warned about once per revision and
        left out, instead of failing every read of the user."""
        rows = self._vectors_of(user_id, records, strict=strict)
        dim, what = self.cache.dim, f"stored vectors of user {user_id!r}"
        try:  # one pass over the block (a cold read of 1k items: no per-row numpy calls)
            block = np.stack(rows)
        except ValueError:  # rows of other lengths: the embedder's fault, not one record's
            as_unit_rows(rows, dim=dim, what=what)  # raises, naming the dimension
            raise
        good = np.isfinite(block).all(axis=1) & block.any(axis=1)
        if good.all():
            return records, items, as_unit_rows(block, dim=dim, what=what), []
        for i in np.flatnonzero(~good):
            self._leave_out(user_id, records[i], known, "has a stored vector of NaN, inf or zeros")
        keep = np.flatnonzero(good).tolist()
        unit = (  # a wrong dimension is the embedder's, not one record's: it raises
            as_unit_rows(block[keep], dim=dim, what=what)
            if keep
            else np.zeros((0, dim or block.shape[1]), dtype=np.float32)
        )
        dropped = [records[i].item_id for i in np.flatnonzero(~good)]
        return [records[i] for i in keep], [items[i] for i in keep], unit, dropped

    def _vectors_of(
        self, user_id: str, records: list[Record], *, strict: bool = False
    ) -> list[np.ndarray]:
        """Vectors of listed records (float32, as stored): the listing's, else fetched, else
        embedded. ``strict``: :class:`_ListingMoved` where a fetched row is not the version
        listed (its stamp, PostgreSQL's ``xmin``, differs, or it is gone): its vector may be of
        another text than the one listed."""
        assert self.host is not None
        missing = [r.key for r in records if r.vector is None]
        got = (
            {r.key: r for r in self.host.fetch(user_id, missing) if r.user_id == user_id}
            if missing
            else {}
        )
        if strict:
            for r in records:
                if r.vector is None and r.stamp is not None:
                    row = got.get(r.key)
                    if row is None or row.stamp != r.stamp:
                        raise _ListingMoved(r.key)
        rows: list[np.ndarray | None] = [
            r.vector if r.vector is not None else _vector_of(got.get(r.key)) for r in records
        ]
        todo = [i for i, v in enumerate(rows) if v is None]
        if todo:
            fresh = embed_documents(
                self.resolved_embedder(), [records[i].text for i in todo], dim=self.cache.dim
            )
            for j, i in enumerate(todo):
                rows[i] = fresh[j]
        return [np.asarray(v, dtype=np.float32).reshape(-1) for v in rows]

    def _windows(self, user_id: str, items: Sequence[HistoryItem]) -> dict[str, np.ndarray]:
        """Window vectors of the items longer than the embedder reads (pbr_core.windows), for
        those not windowed already with the same text."""
        long, pieces = self._to_window(user_id, items)
        if not long:
            return {}
        flat = [text for texts in pieces for text in texts]
        rows = embed_documents(self.resolved_embedder(), flat, dim=self.cache.dim)
        out: dict[str, np.ndarray] = {}
        start = 0
        for item, texts in zip(long, pieces):
            out[item.id] = rows[start : start + len(texts)]
            start += len(texts)
        return out

    def _to_window(
        self, user_id: str, items: Sequence[HistoryItem]
    ) -> tuple[list[HistoryItem], list[list[str]]]:
        """The items longer than the embedder reads and not windowed already with the same
        text, and each one's window texts."""
        window = self._window()
        long: list[HistoryItem] = []
        pieces: list[list[str]] = []
        if window is None:
            return long, pieces
        current = self.cache._current(user_id)
        for item in items:
            if len(item.text.encode("utf-8")) <= window.max_tokens:
                continue  # no tokenizer makes more tokens than bytes
            if current is not None and item.id in current.windows:
                pos = current.position(item.id)
                if pos is not None and current.items[pos].text == item.text:
                    continue  # windowed already
            texts = split(item.text, window)
            if len(texts) > 1:
                long.append(item)
                pieces.append(texts)
        return long, pieces

    def _window(self) -> Window | None:
        """The embedder's window, read once per embedder."""
        embedder = self.resolved_embedder()
        cached = self._window_of
        if cached is None or cached[0] is not embedder:
            cached = self._window_of = (embedder, window_of(embedder))
        return cached[1]

    def _window_tokens(self) -> int | None:
        """The tokens of text the embedder reads (None: no limit): which items have windows."""
        window = self._window()
        return None if window is None else window.max_tokens

    def _drop_if_empty(self, user_id: str) -> None:
        # A host lists no empty users, so there an emptied user is an unknown one; pbr's own
        # store keeps the emptied user (its queries fall back to the plain query).
        if not self.verified:
            return
        history = self.cache._current(user_id)
        if history is not None and len(history) == 0:
            self.cache.drop_user(user_id)


class _Windowed(Exception):
    """A user with an item longer than the embedder reads (:class:`_StateReader`)."""


def _check_derivable(config: object, name: str, takes: str = "a PBRConfig") -> None:
    """Refuse a ``config`` whose state no request would use (:attr:`Corpus.derive_after_write`,
    :meth:`Corpus.derive_states`): ``TypeError`` for one that is not a
    :class:`~pbr_core.PBRConfig`, ``ValueError`` for one whose requests are not ranked in the
    database or that derives nothing."""
    if not isinstance(config, PBRConfig):
        raise TypeError(f"{name} takes {takes}, not {config!r}")
    if not ranks_in_database(config):
        raise ValueError(
            f"{name}: requests of fusion={config.fusion!r} (rerank="
            f"{config.rerank!r}, lexical_context={config.lexical_context}, "
            f"top_anchor_items={config.top_anchor_items}) are not ranked in the "
            "database (that takes no LLM term, no re-rank, no neighbour context and "
            f"top_anchor_items <= {CENTRAL_ITEMS}), so no request would use the state; "
            "give the config of the requests that are, e.g. PBRConfig(fusion='no_prf')"
        )
    if not MODE_TERMS[config.fusion][0] and config.search == "dense":
        raise ValueError(
            f"{name}: plain fusion with dense search derives nothing (no anchor, no BM25 "
            "index): there is no state to share"
        )


class _StateReader(Corpus):
    """The corpus a derivation after a write reads a user with (:meth:`Corpus._derive_now`):
    as any worker new to the user, except that it gives up on an item longer than the
    embedder reads instead of embedding its windows. A state with windows never ranks in the
    database, and its windows would be embedded again on every write."""

    def _windows(self, user_id: str, items: Sequence[HistoryItem]) -> dict[str, np.ndarray]:
        if self._to_window(user_id, items)[0]:
            raise _Windowed(user_id)
        return {}


def _derived(history: UserHistory) -> tuple[Any, ...]:
    """What of ``history``'s derived state is built: its anchors' keys and the analyzers of its
    BM25 indexes (what a shared state holds)."""
    anchors = sorted(repr(k) for k, a in list(history._anchors.items()) if a is not None)
    analyzers = sorted(str(index.stemmer) for index in history.lexical_indexes())
    return (tuple(anchors), tuple(analyzers))


def merge_vectors(known: list[np.ndarray | None], todo: list[int], fresh: np.ndarray) -> np.ndarray:
    """Known vectors with ``fresh[j]`` filled in at position ``todo[j]``, stacked as rows."""
    rows = list(known)
    for j, i in enumerate(todo):
        rows[i] = fresh[j]
    if not rows:
        return np.zeros((0, 0), dtype=np.float32)
    return np.stack([np.asarray(r, dtype=np.float32) for r in rows])


def items_of_texts(
    texts: Sequence[str],
    ids: Sequence[str] | None,
    metadatas: Sequence[Mapping[str, Any]] | None,
    timestamps: Sequence[float | None] | None,
) -> list[HistoryItem]:
    """Texts and their optional parallel lists as items (a new id where none is given, None
    and ``""`` included: :func:`~pbr_core.items.id_or_new`)."""
    texts = check_batch(texts, "texts")  # elements as given: a non-str text is refused later
    ids = None if ids is None else check_batch(ids, "ids")
    n = len(texts)
    for name, seq in (("ids", ids), ("metadatas", metadatas), ("timestamps", timestamps)):
        if seq is not None and len(seq) != n:
            raise ValueError(f"{name} has {len(seq)} entries for {n} texts")
    return [
        HistoryItem(
            id=id_or_new(ids[i] if ids is not None else None),
            text=texts[i],
            metadata=dict(metadatas[i]) if metadatas is not None else {},
            timestamp=timestamps[i] if timestamps is not None else None,
        )
        for i in range(n)
    ]
