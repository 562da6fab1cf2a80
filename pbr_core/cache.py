"""An on-disk cache of LLM generations keyed by (model id, prompt).

Benchmarks and repeated runs never call the LLM twice for the same prompt. The file is JSON Lines,
append-only (one ``{"key", "model", "text", "sha256"}`` object per generation), so it is cheap to
write, safe to commit, and a line torn by a crash is skipped on load instead of poisoning the
cache (also one cut inside a multi-byte character; the next write starts on a new line). A
line whose text does not match its ``sha256`` (damaged in a way that still parses) is skipped
too, with a warning; lines written before the checksum are read as they are.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path

log = logging.getLogger("pbr")


def generation_key(model_id: str, prompt: str) -> str:
    """sha256 of the model id and the prompt: the identity of one generation."""
    # surrogatepass: a prompt with a lone surrogate (text decoded with errors="surrogateescape")
    # still has a key; any other text encodes exactly as plain UTF-8
    data = f"{model_id}\x00{prompt}".encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()


def _text_digest(text: str) -> str:
    """sha256 of a cached text (what a line's ``sha256`` checks)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def check_cache_file(path: str | os.PathLike[str]) -> Path:
    """``path`` as a generation cache's file; ValueError where it is a folder, naming a file in
    it (checked by the cache and, before any model loads, by ``pbr demo --cache``)."""
    file = Path(path)
    if file.is_dir():
        raise ValueError(
            f"the generation cache {file} is a folder; give a file in it, e.g. "
            f"{file / 'generations.jsonl'}"
        )
    return file


class GenerationCache:
    """A thread-safe (model id, prompt) → text map, persisted to ``path`` when one is given.

    ``max_entries`` bounds what it holds in memory (the least recently used answers go first;
    the file keeps every one): a cache a long-running service keeps for consistency rather than
    for a benchmark's reruns. None: unbounded.
    """

    def __init__(
        self, path: str | os.PathLike[str] | None = None, *, max_entries: int | None = None
    ) -> None:
        if max_entries is not None and (
            isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1
        ):
            raise ValueError(f"max_entries must be an integer >= 1 or None, got {max_entries!r}")
        self.path = check_cache_file(path) if path is not None else None
        self.max_entries = max_entries
        self._data: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()
        if self.path is not None and self.path.exists():
            self._load(self.path)
            self._trim()

    def _trim(self) -> None:
        """Drop the least recently used answers beyond ``max_entries`` (lock held, or alone)."""
        if self.max_entries is not None:
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)

    def _load(self, path: Path) -> None:
        damaged = 0
        with path.open("rb") as fh:
            for raw in fh:
                try:
                    row = json.loads(raw.decode("utf-8"))
                    key, text, digest = row["key"], row["text"], row.get("sha256")
                except (
                    UnicodeDecodeError,
                    json.JSONDecodeError,
                    KeyError,
                    TypeError,
                    AttributeError,
                ):
                    continue  # a torn line from an interrupted run
                if not isinstance(key, str) or not isinstance(text, str):
                    continue
                if digest is not None and digest != _text_digest(text):
                    damaged += 1  # parses, but is not what was written: never served
                    continue
                self._data[key] = text
                self._data.move_to_end(key)  # a key written again was used last
        if damaged:
            log.warning(
                "pbr: skipped %d damaged line(s) of the generation cache %s (text and checksum "
                "differ); they will be generated again",
                damaged,
                path,
            )

    def __len__(self) -> int:
        return len(self._data)

    def get(self, model_id: str, prompt: str) -> str | None:
        key = generation_key(model_id, prompt)
        if self.max_entries is None:
            return self._data.get(key)
        with self._lock:  # a read makes the answer the most recently used one
            text = self._data.get(key)
            if text is not None:
                self._data.move_to_end(key)
            return text

    def put(self, model_id: str, prompt: str, text: str) -> None:
        key = generation_key(model_id, prompt)
        with self._lock:
            if self._data.get(key) == text:
                self._data.move_to_end(key)  # the same answer again: used now, not written
                return
            self._data[key] = text
            self._data.move_to_end(key)
            self._trim()
            if self.path is not None:
                self._append(
                    {"key": key, "model": model_id, "text": text, "sha256": _text_digest(text)}
                )

    def _append(self, row: dict[str, str]) -> None:
        """One line at the end of the file; a failed write is logged, never raised: the
        generation is kept in memory, and a cache is an optimisation, not a record."""
        assert self.path is not None
        try:
            data = json.dumps(row, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: JSON's \\u escapes keep it exactly
            data = json.dumps(row).encode("ascii")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("ab+") as fh:
                torn = fh.tell() > 0 and (fh.seek(-1, os.SEEK_END), fh.read(1))[1] != b"\n"
                fh.write((b"\n" if torn else b"") + data + b"\n")
        except OSError as exc:
            log.warning("pbr: could not write the generation cache %s (%s)", self.path, exc)

    async def aput(self, model_id: str, prompt: str, text: str) -> None:
        await asyncio.to_thread(self.put, model_id, prompt, text)
