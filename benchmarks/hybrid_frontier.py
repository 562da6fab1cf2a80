"""Where every no-LLM candidate of issue #42 lands against its goals: the frontier of the
one-parameter-set searches, read from their committed results (no data set, no model).

Why: #42 asks for four LoCoMo numbers at once (turn R@5 ≥ .57, session R@5 ≥ .88, recall_any@5
≥ .62 / .94 on every question with evidence) with one parameter set that is no worse anywhere
else. Each lead script judged its own candidates; this one puts all of them on one chart. A
candidate meets the four goals only if the mean of its four numbers reaches the targets' mean
(.7525), so the chart shows the trade directly: how far each candidate gets on the goals'
mean, against what it costs PrefEval at 300 fillers (where the stronger lexical legs lose) and
whether its own script found it admissible (no significant loss, no more cells below the best
baseline than the shipped rule).

Sources: ``benchmarks/results/hybrid/tuning.json`` (``benchmarks/hybrid_tuning.py``, every hybrid
parameter set; admissible as that script judged it: no significant loss against dense, BM25,
RRF or the rule it replaced, at most that rule's cells below) and the ``tuning`` rows of each
lead of :mod:`pbr_bench.lead` (admissible as each judged it, against the shipped rule too).
Every number is on the tuning split (:func:`pbr_bench.splits.is_tuning_question`); the goals are
stated on every question, so a candidate above the line here is a necessary, not a sufficient,
sign of meeting them.

``python benchmarks/hybrid_frontier.py`` prints the table and writes
``benchmarks/results/hybrid/frontier.{csv,json,png}``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pbr_bench.one_set import GOAL_TARGETS, GOALS
from pbr_bench.paths import RESULTS_DIR, in_repo
from pbr_bench.report import write_csv

HYBRID = RESULTS_DIR / "hybrid"
#: The lead scripts of :mod:`pbr_bench.lead`, in the order they were run.
LEADS = (
    "lexical_prf",
    "lexical_fields",
    "lexical_windows",
    "window_pooling",
    "long_items",
    "dense_prf",
    "lexical_bigrams",
    "lexical_pairs_weight",
    "lexical_peak",
    "lexical_flat",
)
BASELINES = ("shipped", "dense", "bm25", "rrf")
#: What the goals ask for together: the mean of the four targets.
TARGET_MEAN = sum(GOAL_TARGETS.values()) / len(GOAL_TARGETS)
PREFEVAL = "prefeval-explicit-n300 N@5"
REACH = "reach the targets' mean"


def _goal_numbers(row: dict[str, Any]) -> dict[str, float]:
    return {f"{d} {m}": float(row[f"{d} {m}"]) for d, m in GOALS}


def _candidate(source: str, name: str, row: dict[str, Any], goal: float, **rest: Any) -> dict:
    return {
        "source": source,
        "candidate": name,
        "goal mean": goal,
        **_goal_numbers(row),
        PREFEVAL: float(row[PREFEVAL]),
        "personabench-0.0 R@5": float(row["personabench-0.0 R@5"]),
        **rest,
    }


def tuning_candidates() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``hybrid_tuning.py``'s hybrid parameter sets (BM25 alone and the baselines left out),
    and its shipped choice's row without the neighbour context (the rule that ships)."""
    data = json.loads((HYBRID / "tuning.json").read_text())
    limit = data["default's fails"]
    out = []
    for r in data["candidates"]:
        if "fails" not in r:
            continue
        ok = r["sig. losses"] == 0 and r["fails"] <= limit
        out.append(
            _candidate(
                "hybrid_tuning",
                r["candidate"],
                r,
                r["objective"],
                admissible=ok,
                losses=int(r["sig. losses"]),
            )
        )
    dense = next(r for r in data["candidates"] if r["candidate"] == "dense")
    return out, {PREFEVAL: float(dense[PREFEVAL])}


def lead_candidates(name: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A lead's candidates (``tuning`` rows of its JSON) and its shipped rule's row."""
    data = json.loads((HYBRID / f"{name}.json").read_text())
    admissible = set(data["admissible"])
    out, shipped = [], {}
    for r in data["tuning"]:
        if r["method"] == "shipped":
            shipped = _candidate(name, "shipped", r, r["goal mean"], admissible=True, losses=0)
        if r["method"] in BASELINES:
            continue
        losses = len([x for x in r["sig. losses"].split("; ") if x])
        out.append(
            _candidate(
                name,
                r["method"],
                r,
                r["goal mean"],
                admissible=r["method"] in admissible,
                losses=losses,
            )
        )
    return out, shipped


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per source: how many candidates, how many admissible, the best goal mean among the
    admissible and among all (with its losses and PrefEval), and how many reach the line."""
    ok = [r for r in rows if r["admissible"]]
    best_ok = max(ok, key=lambda r: r["goal mean"]) if ok else None
    best = max(rows, key=lambda r: r["goal mean"])
    above = [r for r in rows if r["goal mean"] >= TARGET_MEAN]
    kindest = min(above, key=lambda r: (r["losses"], -r[PREFEVAL])) if above else None
    return {
        "candidates": len(rows),
        "admissible": len(ok),
        "best admissible": best_ok,
        "best": best,
        REACH: len(above),
        "of them admissible": sum(r["admissible"] for r in above),
        "of them the fewest losses": kindest,
        "of them the best PrefEval N=300 N@5": max((r[PREFEVAL] for r in above), default=None),
    }


def _plot(rows: list[dict[str, Any]], shipped: dict[str, Any], dense_pe: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for ok, marker, color, label in (
        (False, "x", "tab:red", "not admissible"),
        (True, "o", "tab:blue", "admissible"),
    ):
        pts = [r for r in rows if r["admissible"] == ok]
        x, y = [r[PREFEVAL] for r in pts], [r["goal mean"] for r in pts]
        ax.scatter(x, y, marker=marker, color=color, s=16, alpha=0.6, label=label)
    ax.scatter(
        [shipped[PREFEVAL]],
        [shipped["goal mean"]],
        marker="s",
        color="black",
        s=50,
        label="shipped rule",
    )
    ax.axhline(
        TARGET_MEAN,
        color="tab:green",
        linestyle="--",
        linewidth=1,
        label=f"the four goals' mean ({TARGET_MEAN:.4f})",
    )
    ax.axvline(dense_pe, color="tab:gray", linestyle=":", linewidth=1, label="dense")
    ax.set_xlabel("PrefEval N = 300 fillers, N@5 (tuning split)")
    ax.set_ylabel("LoCoMo goals' mean (tuning split)")
    ax.set_title(f"#42 no-LLM candidates: {len(rows)} from {len(LEADS) + 1} scripts")
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    rows, dense = tuning_candidates()
    shipped: dict[str, Any] = {}
    for name in LEADS:
        got, its_shipped = lead_candidates(name)
        rows.extend(got)
        shipped = shipped or its_shipped
    sources = ["hybrid_tuning", *LEADS]
    per_source = {s: summary([r for r in rows if r["source"] == s]) for s in sources}
    overall = summary(rows)

    print(
        f"targets' mean {TARGET_MEAN:.4f}; shipped rule {shipped['goal mean']:.4f} "
        f"(PrefEval N=300 N@5 {shipped[PREFEVAL]:.4f}; dense {dense[PREFEVAL]:.4f})"
    )
    print(
        f"{'source':22}{'cands':>6}{'adm.':>6}{'best adm.':>11}{'best':>8}{'losses':>8}"
        f"{'PE300':>8}{'>=line':>8}"
    )
    for s, v in [*per_source.items(), ("all", overall)]:
        b, bo = v["best"], v["best admissible"]
        print(
            f"{s:22}{v['candidates']:6d}{v['admissible']:6d}"
            f"{bo['goal mean'] if bo else float('nan'):11.4f}{b['goal mean']:8.4f}"
            f"{b['losses']:8d}{b[PREFEVAL]:8.4f}{v[REACH]:8d}"
        )
    kindest = overall["of them the fewest losses"]
    print(
        f"reaching the line: the fewest significant losses {kindest['losses']} "
        f"({kindest['source']}: {kindest['candidate']}, PrefEval N=300 N@5 "
        f"{kindest[PREFEVAL]:.4f}); the best PrefEval N=300 N@5 among them "
        f"{overall['of them the best PrefEval N=300 N@5']:.4f}"
    )
    best_goal = {}
    for d, m in GOALS:
        key = f"{d} {m}"
        ok = max((r for r in rows if r["admissible"]), key=lambda r: r[key])
        any_ = max(rows, key=lambda r: r[key])
        best_goal[key] = {
            "target": GOAL_TARGETS[(d, m)],
            "shipped": shipped[key],
            "best admissible": ok[key],
            "best admissible candidate": f"{ok['source']}: {ok['candidate']}",
            "best": any_[key],
            "best candidate": f"{any_['source']}: {any_['candidate']}",
            "best candidate's losses": any_["losses"],
        }
        print(
            f"{key:34} target {GOAL_TARGETS[(d, m)]:.2f}  shipped {shipped[key]:.4f}  "
            f"best admissible {ok[key]:.4f}  best {any_[key]:.4f} ({any_['losses']} losses)"
        )

    out = HYBRID / "frontier"
    write_csv(out.with_suffix(".csv"), rows)
    data = {
        "targets": {f"{d} {m}": v for (d, m), v in GOAL_TARGETS.items()},
        "targets' mean": TARGET_MEAN,
        "shipped": shipped,
        "dense " + PREFEVAL: dense[PREFEVAL],
        "per source": per_source,
        "all": overall,
        "per goal": best_goal,
    }
    out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    _plot(rows, shipped, dense[PREFEVAL], out.with_suffix(".png"))
    print(f"wrote {in_repo(out.with_suffix('.json'))}")


if __name__ == "__main__":
    main()
