"""Speed of windowing long items (pbr_core.windows) with the real MiniLM tokenizer, and of adding
a long item through the embedded MiniLM.

An item longer than the embedder reads (all-MiniLM-L6-v2: 254 word pieces) is split into
windows, each embedded (``docs/method.md``, windows). Splitting must be linear in the item's
length whatever the text; before the fix a text without spaces was quadratic (40k CJK
characters: 9.6 s; a 1 MB item did not finish in 120 s).

Three kinds of text, each at 10 kB, 100 kB and 1 MB of UTF-8, built with a fixed seed:

- ``prose``: words of 2-9 letters from a 5,000-word vocabulary, separated by spaces;
- ``cjk``: random CJK ideographs with no spaces (3 bytes each; one token per character);
- ``url``: letters, digits and ``/-_.`` with no spaces (a long URL or minified code: BERT's
  tokenizer cuts it at every punctuation mark).

Per text: median seconds of :func:`pbr_core.windows.split` over ``--repeats`` runs, the number
of windows, megabytes per second, and a check that every window fits and that the windows put
together are the text (whitespace aside). Then, once per kind at the largest size, the seconds
to add the item to a :class:`pbr_core.Personalizer` on the embedded MiniLM (windowing and
embedding every window and the item itself; no LLM), the cost a user pays for a 1 MB note.

Goal: a 1 MB item windowed in ≤ 10 s on 2 cores, and time per MB flat across sizes (linear).

    python benchmarks/windows_speed.py                  # about two minutes on 2 cores
    python benchmarks/windows_speed.py --no-add         # splitting only
    python benchmarks/windows_speed.py --sizes 10000 100000

Prints a table and writes ``benchmarks/results/windows_speed.{csv,json,png}``.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any

from pbr_bench.paths import RESULTS_DIR
from pbr_bench.report import write_rows
from pbr_core import Personalizer
from pbr_core.models import MiniLMEmbedder
from pbr_core.windows import Window, split, window_of

SIZES = (10_000, 100_000, 1_000_000)  # bytes of UTF-8
GOAL_S_1MB = 10.0
KINDS = ("prose", "cjk", "url")


def text_of(kind: str, size: int, seed: int = 0) -> str:
    """``size`` bytes (UTF-8, give or take a character) of the given kind, fixed by ``seed``."""
    rnd = random.Random(f"{seed}-{kind}")
    if kind == "prose":
        letters = "abcdefghijklmnopqrstuvwxyz"
        vocab = ["".join(rnd.choices(letters, k=rnd.randint(2, 9))) for _ in range(5000)]
        words: list[str] = []
        length = 0
        while length < size:
            words.append(rnd.choice(vocab))
            length += len(words[-1]) + 1
        return " ".join(words)[:size]
    if kind == "cjk":
        return "".join(chr(rnd.randint(0x4E00, 0x9FFF)) for _ in range(size // 3))
    if kind == "url":
        return "".join(rnd.choices("abcdefghijklmnopqrstuvwxyz0123456789/-_.", k=size))
    raise ValueError(f"unknown kind {kind!r}: one of {KINDS}")


def time_split(text: str, window: Window, repeats: int) -> tuple[float, list[str]]:
    times, parts = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        parts = split(text, window)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), parts


def time_add(text: str, embedder: MiniLMEmbedder) -> float:
    """Seconds to add ``text`` as one item of a fresh user (windows and vectors computed)."""
    p = Personalizer(embedder=embedder)  # no LLM is loaded to add
    t0 = time.perf_counter()
    p.add_texts("u", [text])
    return time.perf_counter() - t0


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for kind in KINDS:
        mine = [r for r in rows if r["kind"] == kind]
        ax.plot([r["bytes"] for r in mine], [r["split_s"] for r in mine], marker="o", label=kind)
    ax.axhline(GOAL_S_1MB, color="grey", ls="--", lw=1, label="goal at 1 MB")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("item size (bytes of UTF-8)")
    ax.set_ylabel("split seconds (median)")
    ax.set_title("Windowing with the MiniLM tokenizer: linear in length")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-add", action="store_true", help="skip the add through MiniLM")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "windows_speed")
    args = parser.parse_args()

    embedder = MiniLMEmbedder()
    window = window_of(embedder)
    if window is None:
        raise SystemExit("MiniLM's window could not be read")
    rows: list[dict[str, Any]] = []
    for kind in KINDS:
        for size in sorted(args.sizes):
            text = text_of(kind, size)
            seconds, parts = time_split(text, window, args.repeats)
            whole = "".join(parts).replace(" ", "") == text.replace(" ", "")
            fits = all(window.fits(p) for p in parts)
            nbytes = len(text.encode("utf-8"))
            row: dict[str, Any] = {
                "kind": kind,
                "bytes": nbytes,
                "windows": len(parts),
                "split_s": round(seconds, 3),
                "mb_per_s": round(nbytes / 1e6 / seconds, 2),
                "all_fit": fits,
                "text_kept": whole,
                "add_s": "",
            }
            if not args.no_add and size == max(args.sizes):
                row["add_s"] = round(time_add(text, embedder), 2)
            rows.append(row)
            print(
                f"{kind:6} {nbytes:>9,} B  {len(parts):>5} windows  split {seconds:7.3f} s  "
                f"{row['mb_per_s']:6.2f} MB/s  fit={fits} kept={whole}  add {row['add_s']}"
            )
    meta = {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "load_1min": round(os.getloadavg()[0], 2),
        "max_tokens": window.max_tokens,
        "goal_s_1mb": GOAL_S_1MB,
    }
    write_rows(rows, args.out, payload={"meta": meta, "rows": rows})
    plot(rows, Path(f"{args.out}.png"))
    print(f"wrote {args.out}.csv / .json / .png  ({meta})")


if __name__ == "__main__":
    main()
