"""P-PRF (spec §2.2): prompts for the two LLM calls and lenient parsing of their answers.

Two prompt sets ship: ``CHAT_PROMPTS`` for instruction-following models (JSON answers, as the
paper asked gpt-4o-mini) and ``COMPLETION_PROMPTS`` for base models such as the embedded Gemma 3
270M, which continue a document: those prompts end where a numbered list starts (``"\\n1."``).
Parsing accepts either shape, code fences, trailing commas, prose around the JSON, and more or
fewer items than asked; an answer with nothing usable yields an empty result and a reason, never
an exception.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

PromptStyle = Literal["chat", "completion"]

CHAT_UTTERANCES = """You help a search engine understand one particular user.

Past messages and records of this user, most relevant first:
{history}

The user now says: "{query}"

Write {m} different things this user might plausibly say in a conversation around this \
question. They are not paraphrases of the question: each is a natural, varied utterance of more \
than 25 words, in this user's own tone and style, drawing on details of their history.

Answer with JSON only, in this form: {{"candidates": ["...", "..."]}}"""

CHAT_REASONING = """You help a search engine understand one particular user.

Past messages and records of this user, most relevant first:
{history}

The user now asks: "{query}"

Work through the question step by step, inspired by the user's history: what are they asking, \
which people, places, habits, preferences or events from their history bear on it, and what \
would the answer be about? Be concise (at most 150 words)."""

COMPLETION_UTTERANCES = """Here are some past messages of a user:
{history}

The user asked: {query}
{m} other things this user might say about it, in their own words and style:
1."""

COMPLETION_REASONING = """Here are some past messages of a user:
{history}

Question from the user: {query}
Step-by-step notes on what the user is asking, based on their past messages:
1."""


@dataclass(frozen=True)
class PromptSet:
    """The two P-PRF prompt templates.

    Placeholders: ``{history}`` (the related items, one per line), ``{query}``, and ``{m}`` (the
    number of utterances, utterance prompt only). ``style="completion"`` means the prompt ends
    inside a numbered list whose first marker (``"1."``) the model does not repeat.
    """

    utterances: str = CHAT_UTTERANCES
    reasoning: str = CHAT_REASONING
    style: PromptStyle = "chat"

    def __post_init__(self) -> None:
        for name, template, needed in (
            ("utterances", self.utterances, ("{history}", "{query}")),
            ("reasoning", self.reasoning, ("{history}", "{query}")),
        ):
            missing = [p for p in needed if p not in template]
            if missing:
                raise ValueError(f"the {name} prompt lacks the placeholder(s) {missing}")


#: The placeholders pbr fills in a P-PRF template.
PROMPT_VARIABLES = ("history", "query", "m")


def template_from(render: Callable[[Mapping[str, str]], str]) -> str:
    """A framework's prompt template as a pbr template, ``{history}`` etc. left to fill.

    ``render`` formats the template the framework's own way (its partial values, variable
    mappings and template format applied) with a sentinel for each of
    :data:`PROMPT_VARIABLES`; literal braces are then escaped so that pbr fills only its own
    placeholders. The one rule for both adapters' templates."""
    sentinels = {name: f"\x00pbr:{name}\x00" for name in PROMPT_VARIABLES}
    text = render(sentinels)
    text = text.replace("{", "{{").replace("}", "}}")
    for name, sentinel in sentinels.items():
        text = text.replace(sentinel, "{" + name + "}")
    return text


CHAT_PROMPTS = PromptSet()
COMPLETION_PROMPTS = PromptSet(COMPLETION_UTTERANCES, COMPLETION_REASONING, "completion")
PROMPT_STYLES: tuple[PromptStyle, ...] = ("chat", "completion")


def resolve_prompt_style(
    declared: object, override: str | None = None, fallback: PromptStyle = "chat"
) -> PromptStyle:
    """Which P-PRF prompts suit an LLM: the ``override`` a user gave, else the ``prompt_style``
    the LLM declares (the embedded Gemma: ``"completion"``), else ``fallback`` (what the
    framework knows, e.g. LlamaIndex's ``is_chat_model``). The one rule for the core and both
    adapters; an unknown override is an error, an unknown declaration is ignored."""
    if override is not None:
        if override not in PROMPT_STYLES:
            raise ValueError(f"prompt_style must be one of {PROMPT_STYLES}, got {override!r}")
        return override
    if declared in PROMPT_STYLES:
        return declared
    return fallback


def prompts_for_style(style: PromptStyle) -> PromptSet:
    """The default templates of a prompt style."""
    return COMPLETION_PROMPTS if style == "completion" else CHAT_PROMPTS


def format_history(texts: Sequence[str], max_chars: int) -> str:
    """The related items as a bullet list, each cut to ``max_chars`` on one line."""
    lines = []
    for text in texts:
        flat = " ".join(text.split())
        if len(flat) > max_chars:
            flat = flat[: max_chars - 1].rstrip() + "…"
        lines.append(f"- {flat}")
    return "\n".join(lines) if lines else "- (no earlier messages)"


def cut_query(query: str, max_chars: int | None) -> str:
    """The query as the prompts show it: stripped, and cut to ``max_chars`` (``"…"`` marks the
    cut) like a history item; its line breaks are kept."""
    query = query.strip()
    if max_chars is not None and len(query) > max_chars:
        query = query[: max_chars - 1].rstrip() + "…"
    return query


def build_prompts(
    prompts: PromptSet,
    query: str,
    history: Sequence[str],
    *,
    m: int,
    max_chars: int,
    max_query_chars: int | None = None,
) -> tuple[str, str]:
    """The utterance prompt and the reasoning prompt for one query.

    Args:
        max_chars: each history item is cut to this many characters.
        max_query_chars: the query is cut to this many characters (None: not cut), so that the
            prompts stay bounded whatever the query (``PBRConfig.max_query_chars``).
    """
    block = format_history(history, max_chars)
    values = {"history": block, "query": cut_query(query, max_query_chars), "m": m}
    return _fill(prompts.utterances, values), _fill(prompts.reasoning, values)


_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{(\w+)\}")


def _fill(template: str, values: dict[str, Any]) -> str:
    """``template`` with its ``{name}`` placeholders filled, ``{{`` / ``}}`` as literal braces.

    One pass over the template only (not ``str.format``, which chokes on braces in user text,
    and not a replace per value, which would fill a ``{query}`` written *inside* the history or
    the query: a history of ``"{query}"`` lines would multiply the prompt past its size bound).
    """

    def fill(match: re.Match[str]) -> str:
        token, key = match.group(0), match.group(1)
        if key is None:
            return token[0]  # "{{" -> "{", "}}" -> "}"
        return str(values[key]) if key in values else token

    return _PLACEHOLDER.sub(fill, template)


@dataclass(frozen=True)
class Parsed:
    """What a parser could use from an LLM answer, and why not, if nothing."""

    items: tuple[str, ...]
    problem: str | None = None


# Possessive quantifiers (``*+``, ``++``) wherever whitespace runs meet optional tokens: an
# LLM answer is untrusted input, and backtracking over a long run of spaces made one malformed
# line take hours to parse (cubic), outside the LLM's timeout and, in async code, on the loop.
_FENCE = re.compile(r"```[a-zA-Z0-9_-]*+\s*+\n?(.*?)```", re.S)
_TRAILING_COMMA = re.compile(r",\s*([\]}])")
_LIST_MARKER = re.compile(r"^\s*(?:\d{1,3}\s*[.)\]:-]|[-*•·]|\(\d{1,3}\))\s+")
_JSON_SYNTAX_LINE = re.compile(r'^\s*+(?:[\[\]{}]++|\{?\s*+"[^"]*+"\s*+:\s*+[\[{]?)\s*+,?\s*+$')
_MIN_ITEM_CHARS = 3
#: Half of a surrogate pair, as a JSON escape (``"\ud83d"``) of a cut emoji decodes: no text an
#: embedder can encode (UTF-8), so it is dropped from what the LLM wrote.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
#: An inline list marker inside one line ("… 2. next item"): a number, "." or ")", a space.
_INLINE_MARKER = re.compile(r"(?:(?<=\s)|^)(\d{1,3})[.)]\s+")
#: Answers are cut to this many characters before parsing unless the caller says otherwise.
DEFAULT_MAX_ANSWER_CHARS = 20_000


def strip_fences(text: str) -> str:
    """The content of the first code fence, or the text itself."""
    match = _FENCE.search(text)
    if match:
        return match.group(1)
    # An opened but never closed fence (a truncated answer).
    return re.sub(r"^\s*+```[a-zA-Z0-9_-]*+\s*+\n?", "", text)


def _load_json(text: str) -> Any:
    """The first JSON value found in ``text``, repaired for trailing commas; None if none."""
    candidates = [text]
    for opener, closer in (("{", "}"), ("[", "]")):
        start, end = text.find(opener), text.rfind(closer)
        if start != -1 and end > start:
            candidates.append(text[start : end + 1])
    for cand in candidates:
        for attempt in (cand, _TRAILING_COMMA.sub(r"\1", cand)):
            try:
                return json.loads(attempt)
            except (ValueError, RecursionError):  # RecursionError: "[" * 5000 + "]" * 5000
                continue
    return None


#: The keys an LLM names an object's text by, in a list of objects (``[{"text": ...}]``).
_TEXT_KEYS = ("text", "utterance", "content", "candidate", "query", "question", "message")


def _object_text(value: Mapping[str, Any]) -> str | None:
    """The text of one object in a JSON list: its value under a text key, else its longest
    string value (``{"tone": "casual", "line": "..."}`` -> the line, not the tone)."""
    for key in _TEXT_KEYS:
        if isinstance(value.get(key), str):
            return str(value[key])
    texts = [x for x in value.values() if isinstance(x, str)]
    return max(texts, key=len) if texts else None


def _strings(value: Any) -> list[str] | None:
    """A list of strings from a parsed JSON value, looking inside dicts for the first list."""
    if isinstance(value, list):
        out = []
        for v in value:
            if isinstance(v, str):
                out.append(v)
            elif isinstance(v, dict):
                text = _object_text(v)
                if text is not None:
                    out.append(text)
        return out
    if isinstance(value, dict):
        for key in ("candidates", "utterances", "queries", "questions", "items"):
            if key in value:
                return _strings(value[key])
        for v in value.values():
            got = _strings(v)
            if got:
                return got
    return None


#: Where a JSON answer starts: an object or list whose first value is a string or an object.
_JSON_START = re.compile(r'[\[{]\s*+(?:"|\{|\[)')
#: A JSON string, closed or cut off at the end of the answer (a cut escape too), and whether a
#: ``:`` follows it (then it is a key).
_JSON_STRING = re.compile(r'"((?:[^"\\]|\\.)*+)\\?("\s*+:?|$)', re.S)


@dataclass
class _Open:
    """A JSON container being read by :func:`_salvaged_strings`."""

    kind: str  # "[" or "{"
    in_item: bool  # inside an object that is a list's item (its strings are that item's)
    fields: dict[str, str] = field(default_factory=dict)
    key: str | None = None  # the key whose value comes next
    nested: bool = False  # holds a list or an object


def _json_start(body: str) -> int | None:
    """Where the JSON of a cut-off answer starts: at the start of a line, or on the answer's
    first line after a short preamble ("Sure! {..."), with no list item before it."""
    for match in _JSON_START.finditer(body):
        before = body[: match.start()]
        if "\n" in before and before.rsplit("\n", 1)[1].strip():
            continue  # inside a later line's prose ("Document: {...")
        if any(_LIST_MARKER.match(line) for line in before.splitlines()):
            return None  # a list that mentions JSON ({"mode": "dark"}) is a list
        return match.start()
    return None


def _salvaged_strings(body: str) -> list[str]:
    """The strings of a JSON answer that does not parse (cut off mid-way, one line or many):
    the elements of its lists, and the text of each object that is a list's item (or of the
    answer, where it is one object of strings), as :func:`_object_text` reads a parsed one (a
    ``"tone"`` or a ``"time"`` is not an utterance); the last string is kept even when its
    closing quote never came. An object inside such an item adds nothing."""
    at = _json_start(body)
    if at is None:
        return []
    out: list[str] = []
    stack: list[_Open] = []

    def open_(kind: str) -> None:
        parent = stack[-1] if stack else None
        if parent is not None:
            parent.nested, parent.key = True, None  # the pending key's value is this container
        in_item = parent is not None and (parent.in_item or (kind == "{" and parent.kind == "["))
        stack.append(_Open(kind, in_item))

    def close() -> None:
        done = stack.pop()
        if done.kind != "{" or not done.fields:
            return
        parent = stack[-1] if stack else None
        is_item = (parent is not None and parent.kind == "[" and not parent.in_item) or (
            parent is None and not done.nested
        )
        text = _object_text(done.fields) if is_item else None
        if text is not None:
            out.append(text)

    for match in _JSON_STRING.finditer(body, at):
        for ch in body[at : match.start()]:  # the syntax between two strings
            if ch in "[{":
                open_(ch)
            elif ch in "]}" and stack:
                close()
            elif ch == "," and stack:
                stack[-1].key = None  # a key's value that was no string (a number) has ended
        at = match.end()
        raw, end = match.groups()
        try:
            text = json.loads(f'"{raw}"')
        except ValueError:  # a cut escape ("\u12"): the text as written
            text = raw
        top = stack[-1] if stack else None
        if top is None:
            continue
        if end.endswith(":") and top.kind == "{":
            top.key = text
        elif top.kind == "[":
            if not top.in_item:
                out.append(text)  # a list's element
        elif top.key is not None:
            top.fields[top.key] = text  # an object's field: its text is chosen when it closes
            if not end:  # cut off while writing this field: the one the object was for
                top.fields = {top.key: text}
            top.key = None
    while stack:
        close()
    return out


def looks_like_text(text: str) -> bool:
    """Whether ``text`` reads as writing rather than bytes or symbols: almost all of it printable,
    and at least half of its non-space characters letters or digits (any script)."""
    if not text:
        return False
    printable = sum(1 for ch in text if ch.isprintable() or ch in "\n\t")
    visible = [ch for ch in text if not ch.isspace()]
    alnum = sum(1 for ch in visible if ch.isalnum())
    return printable >= 0.95 * len(text) and bool(visible) and alnum >= 0.5 * len(visible)


def split_inline_list(line: str) -> list[str]:
    """A numbered list written on one line, split into its items.

    ``"1. a 2. b 3. c"`` → ``["1. a", "2. b", "3. c"]``. Only markers that count up from the
    line's first marker split it, so "we ran 5. km" inside item 1 stays where it is.
    """
    first = _INLINE_MARKER.match(line.lstrip())
    if first is None:
        return [line]
    line = line.lstrip()
    expected = int(first.group(1)) + 1
    cuts = [0]
    for match in _INLINE_MARKER.finditer(line, first.end()):
        if int(match.group(1)) == expected:
            cuts.append(match.start())
            expected += 1
    if len(cuts) == 1:
        return [line]
    return [line[a:b].strip() for a, b in zip(cuts, [*cuts[1:], len(line)]) if line[a:b].strip()]


def strip_echo(text: str, prompt: str | None) -> str:
    """``text`` without a verbatim copy of ``prompt`` when more than the copy is there (models
    and pipelines that return the prompt with the continuation, e.g. ``return_full_text``).

    An answer that is *only* the prompt is returned as it is: an echoing LLM (LlamaIndex's
    ``MockLLM``) is parsed like any answer, and ``"safe"`` fusion judges what that is worth.
    """
    if not prompt or not prompt.strip():
        return text
    echo = prompt.strip()
    at = text.find(echo)
    if at == -1:
        return text
    rest = text[:at] + text[at + len(echo) :]
    return rest if rest.strip() else text


def _prepare(text: str, prompt: str | None, max_chars: int | None) -> tuple[str | None, str | None]:
    """The answer ready to parse (echo removed, cut), or None and the reason it is unusable."""
    text = strip_echo(text, prompt)
    if max_chars is not None and len(text) > max_chars:
        text = text[:max_chars]
    if not text.strip():
        return None, "the LLM answer was empty"
    return text, None


_NUMBER_MARKER = re.compile(r"^\s*+\(?(\d{1,3})\s*+[.)\]:-]\s")
_BULLET = re.compile(r"^\s*+[-*•·]\s")


def _numbered(items: Sequence[str]) -> bool:
    """Whether the LLM numbered (or bulleted) a list of strings itself: at least two, numbered
    1, 2, 3, ... or all bulleted; a last item cut off at its marker (``"3."``) is not counted.
    ``["5 - 10 km runs keep me sane"]`` is one item's text, and so are two ranges in a row
    (``"1 - 2 cups ..."``, ``"2 - 3 hours ..."``): a ``-`` numbers only three items or more."""
    items = list(items)
    if items and _NUMBER_MARKER.fullmatch(items[-1].strip() + " "):
        items = items[:-1]  # the answer stopped right after the next number
    if len(items) < 2:
        return False
    if all(_BULLET.match(item) for item in items):
        return True
    numbers = [_NUMBER_MARKER.match(item) for item in items]
    if not all(m is not None and int(m.group(1)) == i for i, m in enumerate(numbers, 1)):
        return False
    dashed = any(m is not None and m.group(0).rstrip().endswith("-") for m in numbers)
    return len(items) >= 3 or not dashed


def _clean(items: Sequence[str], limit: int | None, *, decoded: bool = False) -> tuple[str, ...]:
    """``items`` as utterances: list markers and quotes taken off, short, repeated and non-text
    items dropped, at most ``limit``.

    ``decoded``: the items are JSON strings, whose quotes are their text (``"Casablanca" is my
    favourite film``) and whose leading number is too (``10 - 15 minutes of yoga``), unless every
    item starts with a list marker (the LLM numbered them).
    """
    numbered = decoded and _numbered(items)
    seen: set[str] = set()
    out: list[str] = []
    for raw in items:
        raw = _LONE_SURROGATE.sub("", raw)
        if decoded:
            item = _LIST_MARKER.sub("", raw.strip()) if numbered else raw
            item = item.strip()
        else:
            item = _LIST_MARKER.sub("", raw.strip()).strip().strip('"').strip("'").strip()
            item = item.rstrip(",").strip().strip('"').strip()
        key = item.casefold()
        if len(item) < _MIN_ITEM_CHARS or key in seen or not looks_like_text(item):
            continue
        seen.add(key)
        out.append(item)
    return tuple(out[:limit] if limit is not None else out)


def parse_utterances(
    text: str | None,
    *,
    limit: int | None = None,
    style: PromptStyle = "chat",
    prompt: str | None = None,
    max_chars: int | None = DEFAULT_MAX_ANSWER_CHARS,
) -> Parsed:
    """The pseudo utterances in an LLM answer.

    Tries JSON first (``{"candidates": [...]}``, a bare list, or any dict holding a list; in a
    list of objects, each object's text), then, for a chat answer, the strings of JSON cut off
    mid-way (prose before it left out), then falls back to one item per numbered or bulleted
    line; a numbered list written on one line (``"1. a 2. b 3. c"``) is split into its items.
    A JSON string's quotes and leading number are its text unless every string is numbered.
    With ``style="completion"`` the answer continues a prompt that already printed ``"1."``, so
    its first line is item 1. Items that do not read as text (bytes, symbols) are skipped.

    Args:
        text: the raw answer.
        limit: keep at most this many items (the number asked for).
        style: the prompt style that produced ``text``.
        prompt: the prompt that produced ``text``; a verbatim copy of it in the answer is ignored.
        max_chars: the answer is cut to this many characters first (None: not cut).
    """
    if text is None or not text.strip():
        return Parsed((), "the LLM answer was empty")
    ready, problem = _prepare(text, prompt, max_chars)
    if ready is None:
        return Parsed((), problem)
    body = strip_fences(ready).strip()
    found = _strings(_load_json(body))
    if found and (items := _clean(found, limit, decoded=True)):
        return Parsed(items)
    # A chat prompt asked for JSON: the strings of one cut off mid-way are its items, where
    # they are a list (two or more) or nothing else parses; one string salvaged from text
    # that merely holds some JSON (a date, a role) is not. A completion prompt asked for a
    # numbered list, and JSON there is noise.
    salvaged = _clean(_salvaged_strings(body), limit, decoded=True) if style == "chat" else ()
    if len(salvaged) > 1:
        return Parsed(salvaged)
    lines = [ln for ln in body.splitlines() if ln.strip() and not _JSON_SYNTAX_LINE.match(ln)]
    if style == "completion" and lines:
        lines[0] = "1. " + lines[0].lstrip()
    lines = [item for ln in lines for item in split_inline_list(ln)]
    marked = [ln for ln in lines if _LIST_MARKER.match(ln)]
    items = _clean(marked if marked else lines, limit)
    if style == "chat" and not marked:
        # Prose without a list is not a list of utterances: take sentences only if several.
        items = items if len(items) > 1 else ()
    items = items or salvaged
    if not items:
        return Parsed((), "no utterances could be parsed from the LLM answer")
    return Parsed(items)


def _leaves(value: Any) -> list[str]:
    """Every string value in a parsed JSON value, in document order (keys excluded)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _leaves(v)]
    if isinstance(value, list):
        return [s for v in value for s in _leaves(v)]
    return []


def parse_reasoning(
    text: str | None,
    *,
    style: PromptStyle = "chat",
    prompt: str | None = None,
    max_chars: int | None = DEFAULT_MAX_ANSWER_CHARS,
) -> Parsed:
    """The pseudo reasoning: the answer's text, unwrapped from fences or a JSON string field.

    ``prompt`` and ``max_chars`` as in :func:`parse_utterances`; an answer that does not read as
    text (bytes, symbols) yields nothing.
    """
    if text is None or not text.strip():
        return Parsed((), "the LLM answer was empty")
    ready, problem = _prepare(text, prompt, max_chars)
    if ready is None:
        return Parsed((), problem)
    body = strip_fences(ready).strip()
    value = _load_json(body) if body[:1] in "{[" else None
    strings = [v for v in _leaves(value) if v.strip()]
    if strings:
        body = "\n".join(strings)
    if style == "completion":
        body = "1. " + body
    body = _LONE_SURROGATE.sub("", body).strip()
    if len(body) < _MIN_ITEM_CHARS or not any(ch.isalnum() for ch in body):
        return Parsed((), "the reasoning answer held no text")
    if not looks_like_text(body):
        return Parsed((), "the reasoning answer does not read as text (bytes or symbols)")
    return Parsed((body,))
