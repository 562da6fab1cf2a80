"""PBRStore: Personalize Before Retrieve as a LangGraph long-term memory store.

:class:`PBRStore` wraps any LangGraph ``BaseStore`` (``InMemoryStore``, ``PostgresStore``, ...).
Every operation is the wrapped store's, unchanged (puts, gets, deletes, namespace listings,
searches without a query), except a ``SearchOp`` with a ``query``: that one pbr answers, over
the items under the searched namespace prefix only, with pbr's per-user personalization (when
an ``llm`` is given) and hybrid (dense + BM25) ranking.

Ownership stays in :mod:`pbr_core.corpus`: a small :class:`~pbr_core.corpus.HostRecords` over
the wrapped store lists a namespace prefix's items, so the wrapped store is the truth that
every query is checked against (items put, changed or deleted through any path are seen by the
next query), and pbr's :class:`~pbr_core.corpus.Corpus` keeps only a cache of vectors keyed by
item and text, so a repeated search embeds nothing but the query.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

from langchain_core.embeddings import Embeddings
from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)

from pbr_core import Embedder, GenerationCache, HistoryStore, PBRConfig, Personalizer
from pbr_core.adapters_support import memory_config
from pbr_core.corpus import Corpus, Record, check_user_id
from pbr_core.retrieval import Candidates, Request, retrieve

from ._bridge import LanguageModelLike, generator_for, prompt_set, prompt_style_of

__all__ = ["PBRSearchItem", "PBRStore"]

#: How many items one listing request of the wrapped store asks for.
DEFAULT_PAGE_SIZE = 1000
#: How many namespace prefixes' latest explanations a PBRStore keeps (the least recently
#: searched go first): :meth:`PBRStore.last_explanation` of an older one is None.
EXPLAINED_PREFIXES = 1024
#: The LLM answers a PBRStore with an ``llm`` keeps in memory by default (see ``cache``).
DEFAULT_CACHED_ANSWERS = 1024


def scope_id(namespace_prefix: tuple[str, ...]) -> str:
    """pbr's user id of a searched namespace prefix (its JSON): what :attr:`PBRStore.corpus`
    keys histories by. Two prefixes (so two users) never share one."""
    return json.dumps(list(namespace_prefix), ensure_ascii=False)


def item_key(namespace: tuple[str, ...], key: str) -> str:
    """The record key of the wrapped store's item ``(namespace, key)`` in pbr's corpus."""
    return json.dumps([list(namespace), key], ensure_ascii=False)


def _parse_item_key(text: str) -> tuple[tuple[str, ...], str] | None:
    try:
        namespace, key = json.loads(text)
    except (ValueError, TypeError):
        return None
    if not isinstance(namespace, list) or not all(isinstance(p, str) for p in namespace):
        return None
    return (tuple(namespace), key) if isinstance(key, str) else None


def check_one_user(
    prefix: tuple[str, ...], namespaces: Iterable[tuple[str, ...]], user_index: int
) -> None:
    """Refuse a search of ``prefix`` that would rank items of users other than its own.

    An item's user is element ``user_index`` of its own namespace. A non-negative index counts
    from the start, so every item under a prefix that holds that element has the prefix's user.
    A negative one counts from the end, so an item in a namespace below the searched one
    (``("memories", "alice")`` under a search of ``("memories",)``) has another user element
    than the search: the classic multi-tenant mistake, refused here with what to do instead
    (search the user's namespace, set ``user_index`` to the layout, or opt in with
    ``PBRStore(cross_user_search=True)``).

    Raises:
        ValueError: some item's user element is not the searched one.
    """
    if user_index >= 0:
        return
    # prefix-matched: an item at the searched depth is in the searched namespace itself
    below = sorted({tuple(ns) for ns in namespaces if len(ns) != len(prefix)})
    if not below:
        return
    more = f" and {len(below) - 3} more" if len(below) > 3 else ""
    shown = ", ".join(repr(ns) for ns in below[:3]) + more
    raise ValueError(
        f"PBRStore: a search of {prefix!r} would mix users. With user_index={user_index} an "
        f"item's user is element {user_index} of its own namespace, and items under {prefix!r} "
        f"lie in {shown}, whose user is not {prefix[user_index]!r}. Search one user's namespace "
        f"(e.g. {(*prefix, 'alice')!r}), set user_index to where the user is counted from the "
        "start (user_index=1 for ('memories', user_id, ...)), or build "
        "PBRStore(..., cross_user_search=True) to rank every user's items under a shared prefix "
        "on purpose"
    )


def _json_text(value: dict[str, Any]) -> str | None:
    """A structured memory's fields as text (None where they cannot be written as JSON)."""
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        return None


class NamespaceRecords:
    """A LangGraph ``BaseStore`` as :class:`~pbr_core.corpus.HostRecords`: pbr's "user" is a
    namespace prefix (:func:`scope_id`), their records the items under it whose
    ``value[text_key]`` is a non-blank string. A listing refuses a prefix above the user level
    (:func:`check_one_user`) unless ``cross_user_search``."""

    can_list = True

    def __init__(
        self,
        store: BaseStore,
        text_key: str,
        page_size: int = DEFAULT_PAGE_SIZE,
        *,
        user_index: int = -1,
        cross_user_search: bool = False,
    ):
        self.store = store
        self.text_key = text_key
        self.page_size = page_size
        self.user_index = user_index
        self.cross_user_search = cross_user_search

    def items(self, prefix: tuple[str, ...], filter: dict[str, Any] | None = None) -> list[Item]:
        """Every item under ``prefix`` (matching ``filter``); TTLs are not refreshed by this
        reading.

        One read from the start with a growing limit (``page_size``, doubled until the store
        returns fewer), never ``offset`` pages: stores order a search by a key that need not be
        unique (``PostgresStore``: ``updated_at``, shared by every item of one batch), so
        consecutive pages can overlap and skip items. Reads 2-3x the items in all (4x at worst)
        once there are more than ``page_size``; raise ``page_size`` for large namespaces.
        """
        limit = self.page_size
        while True:
            op = SearchOp(prefix, filter, limit, 0, None, False)
            page = self.store.batch([op])[0]
            assert isinstance(page, list)
            if len(page) < limit:
                break
            limit *= 2
        seen: dict[tuple[tuple[str, ...], str], Item] = {}
        for i in page:
            if isinstance(i, Item) and i.namespace[: len(prefix)] == prefix:
                seen.setdefault((tuple(i.namespace), i.key), i)
        return list(seen.values())

    def text_of(self, item: Item) -> str | None:
        """``value[text_key]``; where that is a dict (LangMem's memory manager writes
        ``{"kind": "Memory", "content": {"content": ...}}``, and a custom schema's fields), its
        own ``text_key`` string, else its JSON (as LangGraph's own index embeds a whole value)."""
        text = item.value.get(self.text_key) if isinstance(item.value, dict) else None
        if isinstance(text, dict):
            inner = text.get(self.text_key)
            text = inner if isinstance(inner, str) else _json_text(text)
        return text if isinstance(text, str) and text.strip() else None

    # -- HostRecords -----------------------------------------------------------------------
    def validate(self, records: Sequence[Record]) -> None:
        """Refuses every write: a memory is a value the wrapped store holds, written with
        ``store.put`` (or ``batch``) under the key the app chooses; a corpus write would store
        only its text, under a key its own delete could not name."""
        if records:
            raise ValueError(
                "a PBRStore's corpus writes nothing: write memories with store.put(namespace, "
                "key, value) / aput / batch (pbr reads them from the wrapped store)"
            )

    def upsert(self, records: Sequence[Record]) -> None:
        self.validate(records)

    def delete(self, user_id: str, keys: Sequence[str]) -> None:
        prefix = tuple(json.loads(user_id))
        ops: list[Op] = []
        for key in keys:
            parsed = _parse_item_key(key)
            if parsed is not None and parsed[0][: len(prefix)] == prefix:  # never outside
                ops.append(PutOp(parsed[0], parsed[1], None))
        if ops:
            self.store.batch(ops)

    def list_user(self, user_id: str) -> list[Record]:
        prefix = tuple(json.loads(user_id))
        items = self.items(prefix)
        if not self.cross_user_search:
            check_one_user(prefix, [i.namespace for i in items], self.user_index)
        out = []
        for item in items:
            text = self.text_of(item)
            if text is not None:
                key = item_key(item.namespace, item.key)
                # No timestamp, no metadata: a record's revision is its text, so its vector is
                # re-made exactly when its key or text changed.
                out.append(Record(key=key, user_id=user_id, item_id=key, text=text))
        return out

    def fetch(self, user_id: str, keys: Sequence[str]) -> list[Record]:
        return []  # a BaseStore returns no vectors: pbr embeds (once per key and text)


class PBRSearchItem(SearchItem):
    """A ``SearchItem`` of a pbr search, with how pbr ranked it in :attr:`pbr`.

    It is the wrapped store's item (``value`` untouched, ``dict()`` as LangGraph's, so a tool
    that shows results to an LLM shows only the memory), plus ``pbr``: ``"result"`` (this
    item's ``score``, and each leg's score and rank) and ``"explanation"`` (the request's, shared
    by its results: the same dict as :meth:`PBRStore.last_explanation`).
    """

    __slots__ = ("pbr",)

    def __init__(self, item: Item, score: float, pbr: dict[str, Any]) -> None:
        super().__init__(
            item.namespace, item.key, item.value, item.created_at, item.updated_at, score=score
        )
        self.pbr = pbr


class PBRStore(BaseStore):
    """A LangGraph store whose natural-language search is pbr's, per user.

    Args:
        inner: the wrapped store: the truth of every item; all other operations are its.
        embeddings: embeds items and queries (LangChain ``Embeddings`` or a pbr ``Embedder``);
            None = the embedded all-MiniLM-L6-v2 (needs the ``local`` extra).
        llm: the model of pbr's two P-PRF calls (chat model, LLM or a Runnable around one);
            None (default) = no LLM call: ``config`` defaults to ``PBRConfig(fusion="plain")``,
            a pure hybrid search of the user's items.
        config: pbr's parameters; default ``PBRConfig()`` with an ``llm``, else
            ``PBRConfig(fusion="plain")``. ``config.search`` picks ``"hybrid"`` (default),
            ``"dense"`` or ``"lexical"`` ranking.
        user_index: which element of a searched namespace prefix names the user; default -1,
            the prefix's last element (``("memories", "alice")`` -> ``"alice"``). A prefix
            without that element, or whose element there is not a non-empty string, raises
            ``ValueError``: there is no shared default user. An item's user is that element of
            its own namespace: with a negative index (counted from the end) a search whose
            prefix has items in deeper namespaces (``("memories",)`` over
            ``("memories", "alice")``) would mix users and raises ``ValueError``, unless
            ``cross_user_search``; with ``user_index >= 0`` the prefix holds the user's element,
            so sub-namespaces of one user are searched with it.
        text_key: the field of an item's ``value`` holding its text (LangMem and the LangGraph
            docs store memories as ``{"content": ...}``). Items without a string there are not
            ranked (non-query searches still return them).
        prompt_style: ``"chat"`` / ``"completion"``; None = the llm's ``prompt_style``.
        strict: raise instead of degrading when an LLM call fails.
        cache: the cache of LLM answers. Default, with an ``llm``: the last
            :data:`DEFAULT_CACHED_ANSWERS` answers in memory, so the pages of one search
            (``offset`` / ``limit``, each a search of its own) rank with the same answers: a
            sampling LLM would otherwise repeat and skip items across pages.
        page_size: how many items the first listing request of ``inner`` asks for (doubled
            until the store returns fewer: offset pages can skip items, see
            :meth:`NamespaceRecords.items`).
        max_staleness_s: see :class:`~pbr_core.corpus.Corpus` (0: every query lists ``inner``).
        max_cache_bytes: the budget (bytes) of pbr's per-user cache
            (:class:`~pbr_core.HistoryStore`); None = its default. ``inner`` lists its items,
            so an evicted user is read back from it on its next search.
        cross_user_search: True lets a query search of a prefix above the user level rank every
            user's items under it (one shared scope, e.g. an admin tool); False (default) refuses
            it, naming the namespaces it would mix.

    A query search of ``namespace_prefix`` ranks the items under that prefix (its
    sub-namespaces included) and nothing else: two users' prefixes differ in the user's
    element, so neither ever sees the other's items. ``filter`` restricts the candidates before
    ranking (evaluated by ``inner``, as LangGraph defines it), then ``offset``/``limit`` cut the
    ranked list. Each result is a :class:`PBRSearchItem` (a ``SearchItem``) copied from
    ``inner`` (value untouched) with ``score`` = pbr's score (what ``config.search`` ranks by)
    and ``pbr``: the result's dense and lexical scores and ranks, and the request's explanation
    (pbr's terms, weights, timings), which is also :meth:`last_explanation` of the prefix.

    Within one :meth:`batch`, pbr's searches run first and see the state before the batch (as
    ``InMemoryStore``'s reads do); the other operations then go to ``inner`` in one call.
    """

    supports_ttl: bool = False

    def __init__(
        self,
        inner: BaseStore,
        embeddings: Embeddings | Embedder | None = None,
        *,
        llm: LanguageModelLike | None = None,
        config: PBRConfig | None = None,
        user_index: int = -1,
        text_key: str = "content",
        prompt_style: Literal["chat", "completion"] | None = None,
        strict: bool = False,
        cache: GenerationCache | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        max_staleness_s: float = 0.0,
        cross_user_search: bool = False,
        max_cache_bytes: int | None = None,
    ) -> None:
        if not isinstance(inner, BaseStore):
            raise TypeError(f"inner must be a LangGraph BaseStore, got {type(inner).__name__}")
        if isinstance(user_index, bool) or not isinstance(user_index, int):
            raise ValueError(f"user_index must be an int, got {user_index!r}")
        if not isinstance(text_key, str) or not text_key:
            raise ValueError("text_key must be a non-empty string")
        if not isinstance(cross_user_search, bool):
            raise ValueError(f"cross_user_search must be a bool, got {cross_user_search!r}")
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be an integer >= 1, got {page_size!r}")
        cfg = memory_config(config, llm is not None, "PBRStore")
        self.inner = inner
        self.ttl_config = inner.ttl_config
        self.supports_ttl = inner.supports_ttl
        self.embeddings = embeddings
        self.llm = llm
        self.config = cfg
        self.user_index = user_index
        self.text_key = text_key
        self.strict = strict
        self.cross_user_search = cross_user_search
        self.records = NamespaceRecords(
            inner,
            text_key,
            page_size,
            user_index=user_index,
            cross_user_search=cross_user_search,
        )
        self.corpus = Corpus(
            self.records,
            embedder=embeddings,
            cache=HistoryStore(max_cache_bytes=max_cache_bytes),
            max_staleness_s=max_staleness_s,
        )
        style = prompt_style_of(llm, prompt_style) if llm is not None else "chat"
        self._style: Literal["chat", "completion"] = style
        self.personalizer = Personalizer(
            corpus=self.corpus,
            config=cfg,
            prompts=prompt_set(style, None, None),
            cache=(
                cache
                if cache is not None or llm is None
                else GenerationCache(max_entries=DEFAULT_CACHED_ANSWERS)
            ),
            strict=strict,
        )
        # the latest explanation of the last EXPLAINED_PREFIXES prefixes searched (an LRU: a
        # service over many users would otherwise hold one per user for good)
        self._explanations: OrderedDict[tuple[str, ...], dict[str, Any]] = OrderedDict()
        self._searched: set[tuple[str, ...]] = set()  # prefixes whose views the corpus keeps
        self._guard = threading.Lock()

    # -- the user ---------------------------------------------------------------------------
    def user_of(self, namespace_prefix: tuple[str, ...]) -> str:
        """The user a search of ``namespace_prefix`` is for (its element at ``user_index``).

        Raises:
            ValueError: the prefix has no such element, or it is not a non-empty string.
        """
        prefix = tuple(namespace_prefix)
        if not -len(prefix) <= self.user_index < len(prefix):
            raise ValueError(
                f"PBRStore needs the user in the searched namespace: element {self.user_index} "
                f"of {prefix!r} does not exist (search e.g. ('memories', user_id), or set "
                "user_index)"
            )
        try:
            return check_user_id(prefix[self.user_index])
        except ValueError:
            raise ValueError(
                f"the user element (index {self.user_index}) of namespace {prefix!r} must be a "
                f"non-empty string, got {prefix[self.user_index]!r}"
            ) from None

    def last_explanation(self, namespace_prefix: tuple[str, ...]) -> dict[str, Any] | None:
        """The explanation of the latest query search of ``namespace_prefix`` in this process
        (None before one, and after one that personalized nothing: no memories, in the filter's
        view, or ``limit=0``): pbr's explanation payload (query, fusion, terms used and dropped,
        ``w1``/``w2``, timings, ``degraded``; its ``user_id`` is pbr's id of the prefix,
        :func:`scope_id`) plus ``"namespace"``, ``"user"``, ``"mode"`` and ``"results"``: per
        result its ``namespace``, ``key``, ``score`` and both legs' scores and ranks. Kept for
        the :data:`EXPLAINED_PREFIXES` most recently searched prefixes."""
        with self._guard:
            found = self._explanations.get(tuple(namespace_prefix))
        return None if found is None else dict(found)

    def _explain(self, prefix: tuple[str, ...], payload: dict[str, Any] | None) -> None:
        """Record the latest search's explanation (None: it personalized nothing), so that an
        earlier search's, which may name deleted memories, is never served as the latest."""
        with self._guard:
            if payload is None:
                self._explanations.pop(prefix, None)
            else:
                self._explanations[prefix] = payload
                self._explanations.move_to_end(prefix)
                while len(self._explanations) > EXPLAINED_PREFIXES:
                    self._explanations.popitem(last=False)

    # -- BaseStore --------------------------------------------------------------------------
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        ops, results, searches, rest = _split(ops)
        for i, search in searches:
            results[i] = self._search(search)
        if rest:
            try:
                done = self.inner.batch([ops[i] for i in rest])
            finally:  # a write that failed may still have landed (a reply lost after commit)
                self._expire_written([ops[i] for i in rest])
            for i, result in zip(rest, done):
                results[i] = result
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        ops, results, searches, rest = _split(ops)
        for i, search in searches:
            results[i] = await asyncio.to_thread(self._search, search)
        if rest:
            try:
                done = await self.inner.abatch([ops[i] for i in rest])
            finally:  # as batch's; the expiry takes the user's lock, which a search's listing
                # thread may hold while it waits on this very loop: never taken on the loop
                await asyncio.to_thread(self._expire_written, [ops[i] for i in rest])
            for i, result in zip(rest, done):
                results[i] = result
        return results

    def _expire_written(self, ops: Sequence[Op]) -> None:
        """This store's own puts and deletes went to ``inner`` directly: the corpus must list
        every searched prefix they fall under again on its next read, however fresh its view."""
        written = {tuple(op.namespace) for op in ops if isinstance(op, PutOp)}
        if not written:
            return
        with self._guard:  # each written namespace's own prefixes: O(its length), not O(searched)
            hit = {ns[:j] for ns in written for j in range(len(ns) + 1) if ns[:j] in self._searched}
        self.corpus.expire(scope_id(p) for p in hit)

    # -- pbr's search: the core's request, translated ------------------------------------------
    def _view(self, prefix: tuple[str, ...], filter: dict[str, Any]) -> Callable[[], Candidates]:
        """LangGraph's ``filter`` as the request's view: the matching items pbr can rank
        (those with a text; a view of none returns no result without an LLM call), listed."""

        def matching() -> Candidates:
            items = self.records.items(prefix, filter)
            texts = self.records.text_of
            return [(item_key(i.namespace, i.key), {}, None) for i in items if texts(i)]

        return matching

    def _search(self, op: SearchOp) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        self.user_of(prefix)  # refuses a namespace without its user
        for name, value in (("limit", op.limit), ("offset", op.offset)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        assert op.query is not None
        uid = scope_id(prefix)
        with self._guard:
            self._searched.add(prefix)
        if op.limit == 0:
            self._explain(prefix, None)
            return []
        generator = generator_for(self.llm, None, self._style) if self.llm is not None else None
        request = Request(
            uid,
            op.query,
            op.offset + op.limit,
            config=self.config,
            generator=generator,
            strict=self.strict,
            skip_unknown=True,  # an empty memory is a new user's normal state: no LLM call
        )
        view = self._view(prefix, op.filter) if op.filter else None
        # the corpus lists inner and embeds only new or changed texts
        got = retrieve(self.corpus, request, self.personalizer.personalize, host_filter=view)
        if got.query is None:  # no memories (in the view): nothing personalized, explained
            self._explain(prefix, None)
            return []
        page = got.results[op.offset : op.offset + op.limit]
        targets = [_parse_item_key(s.key) for s in page]
        gets: list[Op] = [GetOp(t[0], t[1], op.refresh_ttl) for t in targets if t is not None]
        read = self.inner.batch(gets) if gets else []
        answered: list[tuple[Item, dict[str, Any]]] = []  # (the item as read back, its legs)
        for s, item in zip([s for s, t in zip(page, targets) if t is not None], read):
            if not isinstance(item, Item):
                continue  # deleted since the listing
            result = {
                "namespace": item.namespace,
                "key": item.key,
                "score": float(s.hit.score),
                **(s.hit.legs or {}),
            }
            answered.append((item, result))
        payload = got.payload(
            namespace=prefix,
            user=self.user_of(prefix),
            results=[result for _, result in answered],
        )
        self._explain(prefix, payload)
        return [
            PBRSearchItem(item, result["score"], {"result": result, "explanation": payload})
            for item, result in answered
        ]


#: A namespace element that is a template placeholder nobody filled, e.g. LangMem's
#: ``("memories", "{langgraph_user_id}")`` run without ``langgraph_user_id`` in the config: a
#: format field name, so a label that merely has braces (``'{"id": 1}'``) is still a label.
_PLACEHOLDER = re.compile(r"^\{[A-Za-z_]\w*\}$")


def _checked(ops: Iterable[Op]) -> list[Op]:
    """The batch, refused whole (nothing read or written) if any op's namespace holds an unfilled
    placeholder: every user would share that one namespace."""
    ops = list(ops)
    for op in ops:
        namespace = getattr(op, "namespace", None) or getattr(op, "namespace_prefix", None) or ()
        for element in namespace:
            if isinstance(element, str) and _PLACEHOLDER.match(element):
                raise ValueError(
                    f"namespace {tuple(namespace)!r} holds the unfilled placeholder {element!r}: "
                    "every user would share it. Give its value in the run's config, e.g. "
                    "config={'configurable': {'langgraph_user_id': 'alice'}} for LangMem's tools"
                )
    return ops


def _split(
    ops: Iterable[Op],
) -> tuple[list[Op], list[Result], list[tuple[int, SearchOp]], list[int]]:
    """The checked batch, its results to fill, and which ops pbr answers (query searches) and
    which go to the wrapped store, by position."""
    checked = _checked(ops)
    searches = [(i, op) for i, op in enumerate(checked) if isinstance(op, SearchOp) and op.query]
    rest = [i for i, op in enumerate(checked) if not _is_pbr(op)]
    return checked, [None] * len(checked), searches, rest


def _is_pbr(op: Op) -> bool:
    return isinstance(op, SearchOp) and bool(op.query)
