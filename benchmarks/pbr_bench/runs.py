"""The harness's ``run``, ``sweep`` and ``compare`` commands: load a data set, run methods, write
the results (``python -m pbr_bench run ...``, see :mod:`pbr_bench.cli`).

Here, not in :mod:`pbr_bench.cli`, so that :mod:`pbr_bench.reproduce` reruns a committed cell
through :func:`main` without importing the command line that dispatches to it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from pbr_core.config import PBRConfig
from pbr_core.protocols import model_id_of

from .cached import CacheOnly
from .datasets import (
    LOCOMO_QUESTION_SETS,
    Dataset,
    load_locomo,
    load_personabench,
    load_prefeval,
)
from .paths import RESULTS_DIR
from .plots import category_bars, sweep_heatmap
from .report import write_rows
from .runner import ALL_METHODS, PBR_METHODS, Bench, metric_table, save_run

DEFAULT_OUT = RESULTS_DIR
THETAS = [round(0.35 + 0.05 * i, 2) for i in range(10)]  # 0.35 … 0.80
K2S = [1, 3, 5, 10]
ALPHAS = [0.85, 1.0]


def load_dataset(args: argparse.Namespace) -> Dataset:
    if args.dataset == "personabench":
        return load_personabench(args.noise, data_dir=args.data_dir)
    if args.dataset == "locomo":
        return load_locomo(args.level, data_dir=args.data_dir, questions=args.questions)
    if args.dataset == "prefeval":
        return load_prefeval(args.n_filler, data_dir=args.data_dir, max_per_topic=args.per_topic)
    raise SystemExit(f"unknown data set {args.dataset!r}")


def results_dir(args: argparse.Namespace, ds: Dataset) -> Path:
    """``<out>/<data set>``, or below it a folder naming what the run changed (a seeded subset
    ``n<limit>-seed<seed>``, PrefEval's ``per-topic<n>``, a PBRConfig parameter other than the
    default), so a run with other settings never overwrites the default run's files."""
    folder = Path(args.out) / ds.name
    variant = _variant(args)
    return folder / variant if variant else folder


def _variant(args: argparse.Namespace) -> str:
    parts = [f"n{args.limit}-seed{args.seed}"] if args.limit else []
    if getattr(args, "per_topic", None) is not None:
        parts.append(f"per-topic{args.per_topic}")
    for name in ("theta", "k2", "alpha", "k1"):
        value = getattr(args, name, getattr(PBRConfig, name))
        if value != getattr(PBRConfig, name):
            parts.append(f"{name}{value}")
    return "-".join(parts)


def run_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What a run's numbers depend on beyond the data set's name, written into its results."""
    keys = (
        "limit",
        "seed",
        "per_topic",
        "theta",
        "k2",
        "alpha",
        "k1",
        "search",
        "llm",
        "questions",
    )
    return {key: getattr(args, key, None) for key in keys}


def make_bench(args: argparse.Namespace, ds: Dataset) -> Bench:
    generator: Any = None
    if args.llm in ("local", "smollm2"):
        from .llms import harness_generator

        generator = harness_generator(args.llm)
    elif args.llm == "authors" and args.dataset != "personabench":
        raise SystemExit("the authors' generations exist for PersonaBench only")
    if generator is not None and getattr(args, "cached_only", False):
        generator = CacheOnly(model_id_of(generator))  # same cache entries, never generates
    cfg = PBRConfig(theta=args.theta, k2=args.k2, alpha=args.alpha, k1=args.k1)
    name = {"local": "gemma-270m", "smollm2": "smollm2-135m", "authors": "authors", "none": "none"}[
        args.llm
    ]
    return Bench(
        ds,
        config=cfg,
        generator=generator,
        llm_name=name,
        limit=args.limit,
        seed=args.seed,
        k=10,
        search=args.search,
    )


def _print_table(rows: list[dict[str, Any]], stream: Any = None) -> None:
    stream = stream or sys.stdout  # looked up per call: tests and callers may redirect it
    if not rows:
        return
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    print("  ".join(c.ljust(widths[c]) for c in cols), file=stream)
    for r in rows:
        print("  ".join(str(r[c]).ljust(widths[c]) for c in cols), file=stream)


def cmd_run(args: argparse.Namespace) -> int:
    ds = load_dataset(args)
    bench = make_bench(args, ds)
    methods = args.methods.split(",") if args.methods else _default_methods(args.llm)
    out = results_dir(args, ds)
    bench.prefill(methods, batch_size=args.batch_size)
    runs = []
    for method in tqdm(methods, desc=f"{ds.name}: methods", unit="method"):
        run = bench.run(method)
        misses = getattr(bench.generator, "misses", 0)
        if misses:  # --cached-only: scored as failed calls, not as the LLM's answers
            print(f"{method}: {misses} prompts had no cached answer; nothing written")
            return 3
        save_run(run, ds.name, out, settings=run_settings(args))
        runs.append(run)
    cols = ["R@1", "R@5", "N@5", "R@10", "N@10", "MRR"]
    rows = metric_table(runs, cols)
    tag = f"{args.llm}" + (f"-n{args.limit}" if args.limit else "")
    tag += "-hybrid" if args.search != "dense" else ""
    write_rows(rows, out / f"summary__{tag}")
    category_bars(runs, "R@5", f"{ds.name}: R@5 by category ({tag})", out / f"bars__{tag}.png")
    print(f"\n{ds.name} ({len(bench.queries)} questions, LLM: {args.llm})")
    _print_table(rows)
    return 0


def _default_methods(llm: str) -> list[str]:
    if llm == "none":
        return ["plain", "bm25", "pbr-no-prf"]
    if llm == "authors":
        return ["plain", "bm25", *PBR_METHODS]
    return list(ALL_METHODS)


def cmd_sweep(args: argparse.Namespace) -> int:
    ds = load_dataset(args)
    bench = make_bench(args, ds)
    out = Path(args.out) / ds.name
    rows: list[dict[str, Any]] = []
    grid = [(a, t, k) for a in ALPHAS for t in THETAS for k in K2S]
    for alpha, theta, k2 in tqdm(grid, desc=f"{ds.name}: sweep θ×k2×α", unit="config"):
        cfg = bench.config.with_(theta=theta, k2=k2, alpha=alpha)
        run = bench.run(args.method, config=cfg, progress=False)
        o = run.metrics["Overall"]
        rows.append(
            {
                "alpha": alpha,
                "theta": theta,
                "k2": k2,
                "R@5": round(o["R@5"], 4),
                "N@5": round(o["N@5"], 4),
            }
        )
    tag = f"{args.method}__{args.llm}"
    write_rows(rows, out / f"sweep__{tag}")
    for alpha in ALPHAS:
        g = np.array(
            [[r["R@5"] for r in rows if r["alpha"] == alpha and r["theta"] == t] for t in THETAS]
        )
        sweep_heatmap(
            g,
            THETAS,
            K2S,
            f"{ds.name} {args.method} R@5, α={alpha}",
            out / f"sweep__{tag}__alpha{alpha}.png",
        )
    best = max(rows, key=lambda r: (r["R@5"], r["N@5"]))
    _print_table(sorted(rows, key=lambda r: -r["R@5"])[:10])
    print(f"best: {best}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from .compare import load_rankings, paired

    ds = load_dataset(args)
    folder = results_dir(args, ds)
    base_path = folder / f"{ds.name}__{args.baseline}.rankings.jsonl"
    if not base_path.exists():  # rankings are not committed: `run` (or `reproduce`) writes them
        raise SystemExit(
            f"no rankings of {args.baseline} in {folder}: run `python -m pbr_bench run` with the "
            "same data set first (`python -m pbr_bench reproduce --write`: every committed cell)"
        )
    base = load_rankings(base_path)
    rows = []
    for name in sorted(folder.glob(f"{ds.name}__*.rankings.jsonl")):
        method = name.name[len(ds.name) + 2 : -len(".rankings.jsonl")]
        if method == args.baseline:
            continue
        p = paired(ds, base, load_rankings(name), method, k=5)
        rows.append(
            {
                "method": method,
                "wins": p.wins,
                "losses": p.losses,
                "ties": p.ties,
                "mean_dR@5": round(p.mean_delta, 4),
                "sign_p": float(f"{p.p_value:.2g}"),
            }
        )
    write_rows(rows, folder / f"paired_vs_{args.baseline}")
    print(f"{ds.name}: R@5 per question against {args.baseline}")
    _print_table(rows)
    return 0


def add_commands(sub: Any) -> None:
    """Add ``run``, ``sweep`` and ``compare`` to ``sub`` (an ``add_subparsers()`` result)."""
    for name in ("run", "sweep", "compare"):
        s = sub.add_parser(name)
        s.add_argument(
            "--dataset", choices=["personabench", "locomo", "prefeval"], default="personabench"
        )
        s.add_argument("--noise", default="0.0", help="PersonaBench noise level")
        s.add_argument("--level", default="turn", choices=["turn", "session"], help="LoCoMo")
        s.add_argument(
            "--questions",
            default="no-adversarial",
            choices=list(LOCOMO_QUESTION_SETS),
            help="LoCoMo: categories 1-4 (1,536 questions, the committed runs) or all with "
            "evidence, adversarial included (1,982, as published memory-system numbers)",
        )
        s.add_argument("--n-filler", type=int, default=10, help="PrefEval filler messages")
        s.add_argument("--per-topic", type=int, default=None, help="PrefEval items per topic")
        s.add_argument("--llm", choices=["none", "authors", "local", "smollm2"], default="none")
        s.add_argument(
            "--batch-size", type=int, default=8, help="prompts per batched local-LLM call"
        )
        s.add_argument("--limit", type=int, default=None, help="seeded random subset")
        s.add_argument("--seed", type=int, default=0)
        s.add_argument("--theta", type=float, default=PBRConfig.theta)
        s.add_argument("--k2", type=int, default=PBRConfig.k2)
        s.add_argument("--alpha", type=float, default=PBRConfig.alpha)
        s.add_argument("--k1", type=int, default=PBRConfig.k1)
        s.add_argument(
            "--search",
            choices=["dense", "hybrid"],
            default="dense",
            help="dense: q* against the user's vectors (the paper's protocol, the committed "
            "results); hybrid: the library's default search (dense + BM25 fused) for plain and "
            "the PBR methods, saved as <method>+hybrid",
        )
        s.add_argument(
            "--cached-only",
            action="store_true",
            help="local LLMs: score from the committed generation cache only, never generate "
            "(a miss fails the run); what `reproduce` uses",
        )
        s.add_argument(
            "--data-dir",
            default=None,
            help="the folder holding the benchmark data sets (default: $PBR_DATA_DIR; see "
            "docs/benchmarks.md)",
        )
        s.add_argument("--out", default=str(DEFAULT_OUT))
        if name == "run":
            s.add_argument(
                "--methods", default=None, help=f"comma-separated, from {', '.join(ALL_METHODS)}"
            )
        elif name == "sweep":
            s.add_argument("--method", default="pbr", choices=[*PBR_METHODS])
        else:
            s.add_argument("--baseline", default="plain__none", help="<method>__<llm>")


#: The commands of this module by name, for :mod:`pbr_bench.cli` to dispatch.
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": cmd_run,
    "sweep": cmd_sweep,
    "compare": cmd_compare,
}


def main(argv: Sequence[str]) -> int:
    """Run one of ``run``, ``sweep``, ``compare`` from its command line (``["run", ...]``)."""
    p = argparse.ArgumentParser(prog="python -m pbr_bench")
    add_commands(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(argv)
    return COMMANDS[args.command](args)
