"""Would a trimmed output projection sample the same text? (issue #41, first lead, measured only)

Gemma 3 270M's output projection covers a 262,144-token vocabulary (170M of its 270M
parameters) and is about half of every decoding step. Restricting it to a kept set ``K`` of
tokens is exact for top-k sampling only when the k highest (repetition-penalised) logits all lie
in ``K``: then the renormalised top-k distribution, and so the draw, is the same. This script
generates the P-PRF prompts' answers with the default generator (full vocabulary), then
teacher-forces each answer and counts, per decoding step, whether

- ``top64_in``: the 64 highest logits all lie in ``K`` (the draw is exactly the same);
- ``token_in``: the token actually drawn lies in ``K`` (the least a trimmed head must keep);

for kept sets derived from the tokenizer alone (no data set's text): the first N ids (Gemma's
ids are not frequency-ordered, so this is a poor set), the pieces made of ASCII, and ASCII plus
Latin-1 and General Punctuation (typographic quotes and dashes), each also with the prompt's own
tokens added (known at run time). It also times one projection, full and trimmed, for a batch of
two (bf16, the default dtype), next to a whole decoding step.

    python benchmarks/vocab_trim.py --queries 8

Writes ``benchmarks/results/vocab_trim.{json,csv,png}``. It implements no trimming in the library:
see docs/performance.md for what the numbers mean for the embedded LLM's speed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import numpy as np
import torch

from pbr_bench.gemma import decode_parts, prompt_pairs
from pbr_bench.paths import RESULTS_DIR
from pbr_bench.report import write_rows
from pbr_core.models import LocalGemmaGenerator

TOP_K = 64


def _piece_text(piece: str) -> str:
    return piece.replace("\u2581", " ")


def kept_sets(tok: Any, vocab: int) -> dict[str, np.ndarray]:
    """Boolean masks over the vocabulary, derived from the tokenizer only."""
    pieces = tok.convert_ids_to_tokens(list(range(vocab)))
    texts = [_piece_text(p) if isinstance(p, str) else "" for p in pieces]

    def only(chars_ok: Any) -> np.ndarray:
        return np.array([bool(t) and all(chars_ok(c) for c in t) for t in texts])

    def ascii_ok(c: str) -> bool:
        return 32 <= ord(c) < 127 or c in "\n\t"

    def latin_ok(c: str) -> bool:
        return ascii_ok(c) or 0xA0 <= ord(c) <= 0xFF or 0x2000 <= ord(c) <= 0x206F

    special = np.zeros(vocab, dtype=bool)
    special[[i for i in tok.all_special_ids if i < vocab]] = True
    sets = {f"first {n // 1000}k ids": np.arange(vocab) < n for n in (32_000, 64_000, 131_072)}
    sets["ascii"] = only(ascii_ok) | special
    sets["ascii+latin1+punct"] = only(latin_ok) | special
    return sets


def penalised(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """transformers' repetition penalty over every token already in the sequence."""
    picked = logits[seen]
    logits[seen] = torch.where(picked > 0, picked / penalty, picked * penalty)
    return logits


def step_counts(
    model: Any, prompt_ids: list[int], answer_ids: list[int], sets: dict[str, np.ndarray], rp: float
) -> dict[str, list[int]]:
    """Per kept set: steps whose top-64 lie in it, steps whose drawn token does (and +prompt)."""
    ids = torch.tensor([prompt_ids + answer_ids])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0].float()
    start = len(prompt_ids) - 1  # the logits at position i predict token i + 1
    counts: dict[str, list[int]] = {}
    prompt_mask = np.zeros(logits.shape[1], dtype=bool)
    prompt_mask[prompt_ids] = True
    for name in sets:
        counts[name] = [0, 0]
        counts[f"{name} + prompt"] = [0, 0]
    for step, token in enumerate(answer_ids):
        seen = torch.tensor(sorted(set(prompt_ids + answer_ids[:step])))
        row = penalised(logits[start + step].clone(), seen, rp)
        top = row.topk(TOP_K).indices.numpy()
        for name, mask in sets.items():
            for label, keep in ((name, mask), (f"{name} + prompt", mask | prompt_mask)):
                counts[label][0] += bool(keep[top].all())
                counts[label][1] += bool(keep[token])
    return counts


def head_ms(weight: torch.Tensor, hidden: torch.Tensor, reps: int = 30) -> float:
    times = []
    with torch.inference_mode():
        for _ in range(reps):
            t0 = time.perf_counter()
            hidden @ weight.T
            times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def plot(rows: list[dict[str, Any]], path: Any) -> None:
    """Per kept set: the share of steps drawn exactly, and of drawn tokens kept."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["kept_set"] for r in rows]
    y = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.barh(y - 0.2, [r["top64_in"] for r in rows], height=0.4, label="top-64 all kept")
    ax.barh(y + 0.2, [r["token_in"] for r in rows], height=0.4, label="drawn token kept")
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xlabel("share of decoding steps")
    ax.set_title("Gemma 3 270M: a trimmed output projection's kept sets")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--queries", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    pairs = prompt_pairs(args.queries, args.seed)
    gen = LocalGemmaGenerator()
    model, tok = gen._load()
    vocab = model.lm_head.weight.shape[0]
    sets = kept_sets(tok, vocab)
    totals: dict[str, list[int]] = {}
    steps = 0
    stops = {tok.eos_token_id, tok.pad_token_id, tok.convert_tokens_to_ids("<end_of_turn>")}
    for _qid, pair in pairs:
        out, prompt_len = gen._sample(model, tok, list(pair))
        enc = tok(list(pair))["input_ids"]
        for row, prompt_ids in enumerate(enc):
            answer = out[row, prompt_len:].tolist()
            cut = next((i for i, t in enumerate(answer) if t in stops), len(answer))
            answer = answer[:cut]
            if not answer:
                continue
            counts = step_counts(model, prompt_ids, answer, sets, gen.repetition_penalty)
            steps += len(answer)
            for label, (top_in, tok_in) in counts.items():
                t = totals.setdefault(label, [0, 0])
                t[0] += top_in
                t[1] += tok_in
    weight = model.lm_head.weight.detach()
    hidden = torch.randn(2, 1, weight.shape[1], dtype=weight.dtype)
    full_ms = head_ms(weight, hidden)
    _, step_ms = decode_parts(model, tok, list(pairs[0][1]))
    rows: list[dict[str, Any]] = []
    for label, (top_in, tok_in) in totals.items():
        base = label.removesuffix(" + prompt")
        kept = int(sets[base].sum())
        trimmed = weight[torch.from_numpy(np.flatnonzero(sets[base]))].contiguous()
        rows.append(
            {
                "kept_set": label,
                "kept_tokens": kept if label == base else f"{kept} + prompt",
                "top64_in": round(top_in / steps, 4),
                "token_in": round(tok_in / steps, 4),
                "head_ms": round(head_ms(trimmed, hidden), 2),
                "full_head_ms": round(full_ms, 2),
                "step_ms": round(step_ms, 1),
            }
        )
    payload = {
        "prompts": 2 * len(pairs),
        "decoding_steps": steps,
        "vocabulary": vocab,
        "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
        "rows": rows,
    }
    write_rows(rows, RESULTS_DIR / "vocab_trim", payload=payload)
    plot(rows, RESULTS_DIR / "vocab_trim.png")
    print(f"{steps} decoding steps over {2 * len(pairs)} prompts; full projection {full_ms:.1f} ms")
    print(f"of a {step_ms:.1f} ms step (batch of 2)")
    for r in rows:
        print(
            f"{r['kept_set']:32} {r['kept_tokens']!s:>16}  top-64 in {r['top64_in']:.3f}  "
            f"drawn token in {r['token_in']:.3f}  head {r['head_ms']:.1f} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
