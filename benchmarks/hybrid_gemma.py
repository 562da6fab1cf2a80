"""Hybrid + PBR with the embedded Gemma 3 270M's feedback, PersonaBench 0.0 (issue #24).

The same users and rankings as ``benchmarks/hybrid.py``, with ``q*`` from a
:class:`pbr_core.Personalizer` (default ``PBRConfig``: safe fusion, pre-generation gate) whose
LLM answers come only from the committed generation cache of the embedded Gemma
(``benchmarks/cache/gemma-3-270m-*.jsonl``): no model runs, a prompt missing from the cache
would count as a failed call (the run reports how many; 0 expected). Rows: dense and hybrid
without an LLM, dense + PBR, hybrid + PBR at lexical feedback weights 0, 0.25 (the default) and
0.5; paired sign tests of the default against the no-LLM hybrid, dense + PBR and weight 0.

    python benchmarks/hybrid_gemma.py   # about a minute; writes results/hybrid/gemma_*.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import hybrid as H  # noqa: E402

from pbr_bench.compare import sign_test  # noqa: E402
from pbr_bench.embed import EmbeddingCache  # noqa: E402
from pbr_bench.runner import CachedEmbedder  # noqa: E402
from pbr_core import GenerationCache, PBRConfig, Personalizer  # noqa: E402
from pbr_core.hybrid import lexical_query, lexical_terms, rank  # noqa: E402
from pbr_core.models import MiniLMEmbedder  # noqa: E402
from pbr_core.windows import window_of  # noqa: E402

CACHE = (
    ROOT
    / "benchmarks"
    / "cache"
    / "gemma-3-270m-q4_k_m_fp32_t_0.8_p_0.95_k_64_rp_1.1_max_160.jsonl"
)
OUT = ROOT / "benchmarks" / "results" / "hybrid" / "gemma_personabench.json"
WEIGHTS = (0.0, 0.25, 0.5)


class CachedGemma:
    """The embedded Gemma's identity, answering from the generation cache only."""

    model_id = "gemma-3-270m-q4_k_m/fp32?t=0.8,p=0.95,k=64,rp=1.1,max=160"
    prompt_style = "completion"
    in_process = True

    def __init__(self) -> None:
        self.misses = 0

    def generate(self, prompt: str) -> str:
        self.misses += 1
        raise RuntimeError("prompt not in the generation cache")


def main() -> None:
    counter = H.CountingEncoder()
    cache = EmbeddingCache("all-MiniLM-L6-v2", counter)
    window = window_of(MiniLMEmbedder())
    assert window is not None
    built = H.build("personabench-0.0", cache, counter, window)
    gemma = CachedGemma()
    personalizer = Personalizer(
        CachedEmbedder(cache),
        gemma,
        config=PBRConfig(),
        store=built.windowed,
        cache=GenerationCache(CACHE),
    )
    rows: dict[str, dict[str, list[str]]] = {"dense": {}, "hybrid": {}, "dense + PBR (gemma)": {}}
    rows.update({f"hybrid + PBR (gemma), lexical feedback {w:g}": {} for w in WEIGHTS})
    for q in built.queries:
        hw, hp = built.windowed.get(q.user_id), built.plain.get(q.user_id)
        plain_terms = lexical_query(q.text)
        rows["dense"][q.id] = H.ids(hp, rank(hp, built.qvec[q.id], plain_terms, H.K, mode="dense"))
        rows["hybrid"][q.id] = H.ids(hw, rank(hw, built.qvec[q.id], plain_terms, H.K))
        pq = personalizer.personalize(q.user_id, q.text)
        terms = lexical_terms(pq.explanation, 0.0)
        rows["dense + PBR (gemma)"][q.id] = H.ids(hp, rank(hp, pq.vector, terms, H.K, mode="dense"))
        for w in WEIGHTS:
            ranked = rank(hw, pq.vector, lexical_terms(pq.explanation, w), H.K)
            rows[f"hybrid + PBR (gemma), lexical feedback {w:g}"][q.id] = H.ids(hw, ranked)
    r5 = {m: [H.r_at_5(r, q) for q in built.queries] for m, r in rows.items()}
    default = "hybrid + PBR (gemma), lexical feedback 0.25"
    paired = []
    for other in ("hybrid", "dense + PBR (gemma)", "hybrid + PBR (gemma), lexical feedback 0"):
        d = np.array(r5[default]) - np.array(r5[other])
        wins, losses = int((d > 0).sum()), int((d < 0).sum())
        paired.append(
            {
                "method": default,
                "baseline": other,
                "wins": wins,
                "losses": losses,
                "mean_delta": float(d.mean()),
                "p_sign": sign_test(wins, losses),
            }
        )
    result = {
        "dataset": "personabench-0.0",
        "questions": len(built.queries),
        "llm_cache_misses": gemma.misses,
        "R@5": {m: float(np.mean(v)) for m, v in r5.items()},
        "paired": paired,
    }
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    for m, v in result["R@5"].items():
        print(f"{m:48s} R@5 {v:.4f}")
    for p in paired:
        print(
            f"{p['method']} vs {p['baseline']}: {p['wins']}/{p['losses']}, "
            f"{p['mean_delta']:+.4f}, p {p['p_sign']:.2g}"
        )
    print(f"LLM prompts missing from the cache: {gemma.misses}")


if __name__ == "__main__":
    main()
