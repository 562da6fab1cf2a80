"""An on-disk cache of LLM generations keyed by (model id, prompt).

Benchmarks and repeated runs never call the LLM twice for the same prompt. The file is JSON Lines,
append-only (one ``{"key", "model", "text"}`` object per generation), so it is cheap to write,
safe to commit, and a line torn by a crash is skipped on load instead of poisoning the cache.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import threading
from pathlib import Path


def generation_key(model_id: str, prompt: str) -> str:
    """sha256 of the model id and the prompt: the identity of one generation."""
    return hashlib.sha256(f"{model_id}\x00{prompt}".encode()).hexdigest()


class GenerationCache:
    """A thread-safe (model id, prompt) → text map, persisted to ``path`` when one is given."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._data: dict[str, str] = {}
        self._lock = threading.Lock()
        if self.path is not None and self.path.exists():
            self._load(self.path)

    def _load(self, path: Path) -> None:
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                try:
                    row = json.loads(line)
                    self._data[row["key"]] = row["text"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a torn last line from an interrupted run

    def __len__(self) -> int:
        return len(self._data)

    def get(self, model_id: str, prompt: str) -> str | None:
        return self._data.get(generation_key(model_id, prompt))

    def put(self, model_id: str, prompt: str, text: str) -> None:
        key = generation_key(model_id, prompt)
        with self._lock:
            if self._data.get(key) == text:
                return
            self._data[key] = text
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                line = json.dumps({"key": key, "model": model_id, "text": text}, ensure_ascii=False)
                with self.path.open("a", encoding="utf-8") as fh:
                    fh.write(line + "\n")

    async def aput(self, model_id: str, prompt: str, text: str) -> None:
        await asyncio.to_thread(self.put, model_id, prompt, text)
