"""The cells of the safe-fusion report (issue #9), shared by the scripts that score them.

``benchmarks/safe_report.py`` prints these cells, ``benchmarks/safe_variants.py`` scores fusion
variants on the same cells and judges them by :func:`admissible`, the bar
``benchmarks/safe_sweep.py`` chose the trust ramp by.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .cached import cached_bench, local_ids
from .compare import paired
from .datasets import Dataset, load_named, load_personabench
from .paths import RESULTS_DIR
from .runner import Bench, MethodRun

#: The paper's PBR with gpt-4o-mini on PersonaBench noise 0.0 (its only reported level).
PAPER = {"R@5": 0.4516, "N@5": 0.3855}

OUT = RESULTS_DIR
#: label -> (bench method, config changes): safe with and without its history gate.
MODES: dict[str, tuple[str, dict[str, Any]]] = {
    "plain": ("plain", {}),
    "paper": ("pbr", {}),
    "safe, no gate": ("pbr-safe", {"safe_history_gate": False}),
    "safe": ("pbr-safe", {}),
}
LOCOMO_LIMIT = 30
#: Held-out cells generated after the history gate was designed: (dataset, limit, seed).
HELD_OUT = [
    ("locomo-turn", 30, 1),
    ("locomo-turn", 200, 2),  # generated after the ramp was chosen on all of PersonaBench 0.0
    ("locomo-turn", 200, 3),  # generated after rank-level fusion was tried (safe_variants.py)
    ("prefeval-explicit-n10", 30, 0),
    ("prefeval-explicit-n50", 30, 0),
]

#: Data sets also scored on every question an LLM has answered (the union of the seeded subsets
#: above, each question once): LoCoMo's verdict, as no single subset is large enough alone.
POOLED = ["locomo-turn"]
ALL_ANSWERED = "all"

#: The columns of the result table (the plain row has no wins / losses).
FIELDS = ["dataset", "llm", "fusion", "questions", "seed", "R@5", "N@5", "wins", "losses", "sign_p"]


def benches() -> Iterator[tuple[Dataset, Bench, str, int | str]]:
    """Every cell this report scores, as ``(data set, bench, LLM label, seed)``.

    PersonaBench 0.0 / 0.7 with the authors' and each local LLM's cached generations, LoCoMo turn
    level, then ``HELD_OUT``, then ``POOLED`` (seed ``"all"``); a cell whose generations are not
    cached is skipped.
    """
    ids = local_ids()
    for noise in ("0.0", "0.7"):
        ds = load_personabench(noise)
        yield ds, Bench(ds, llm_name="authors"), "authors (gpt-4o-mini)", 0
        for name, model_id in ids.items():
            # Every scored question: both local LLMs have answered all of PersonaBench 0.0 and
            # 0.7 (cached_bench counts and drops any question whose answers are not cached).
            bench = cached_bench(ds, name, model_id, limit=None)
            if bench is None:
                continue
            yield ds, bench, name, 0
    for name, limit, seed in [("locomo-turn", LOCOMO_LIMIT, 0), *HELD_OUT]:
        ds = load_named(name)
        for llm, model_id in ids.items():
            bench = cached_bench(ds, llm, model_id, limit=limit, seed=seed)
            if bench is not None:
                yield ds, bench, llm, seed
    for name in POOLED:
        ds = load_named(name)
        for llm, model_id in ids.items():
            bench = cached_bench(ds, llm, model_id, limit=None)
            if bench is not None:
                yield ds, bench, llm, ALL_ANSWERED


def score(
    ds: Dataset,
    bench: Bench,
    llm: str,
    seed: int | str,
    fusion: str,
    run: MethodRun,
    plain: MethodRun,
) -> dict[str, Any]:
    """One table row: ``run``'s Overall R@5 / N@5, and its R@5 wins / losses against ``plain``."""
    o = run.metrics["Overall"]
    row: dict[str, Any] = {
        "dataset": ds.name,
        "llm": llm,
        "fusion": fusion,
        "questions": len(bench.queries),
        "seed": seed,
        "R@5": round(o["R@5"], 4),
        "N@5": round(o["N@5"], 4),
    }
    if run is not plain:
        pair = paired(ds, plain.rankings, run.rankings, fusion, k=5)
        row.update(wins=pair.wins, losses=pair.losses, sign_p=float(f"{pair.p_value:.2g}"))
    return row


def cells(ds: Dataset, bench: Bench, llm: str, seed: int | str = 0) -> list[dict[str, Any]]:
    runs = {
        label: bench.run(method, config=bench.config.with_(**changes), progress=False)
        for label, (method, changes) in MODES.items()
    }
    return [score(ds, bench, llm, seed, label, run, runs["plain"]) for label, run in runs.items()]


def admissible(
    safe: dict[str, dict[str, float]], plain: dict[str, dict[str, float]], paper_check: bool
) -> bool:
    """The adoption rule's bar, per LLM source: R@5 and N@5 at least the plain query's, and with
    ``paper_check`` the authors' generations (sources named ``authors...``) at least the paper's."""
    ok = all(safe[n][m] >= plain[n][m] for n in safe for m in PAPER)
    if paper_check:
        authors = [n for n in safe if n.startswith("authors")]
        ok = ok and all(safe[n][m] >= PAPER[m] for n in authors for m in PAPER)
    return ok
