"""Write the result tables of ``docs/hybrid.md`` from ``benchmarks/results/hybrid/*.csv``.

The numbers in the docs are generated, never typed: this replaces the text between the markers
``<!-- hybrid-results:start -->`` and ``<!-- hybrid-results:end -->`` in ``docs/hybrid.md``.

    python benchmarks/hybrid.py          # the measurement (minutes; writes the CSVs)
    python benchmarks/hybrid_llm.py      # the local LLMs' rows (minutes; writes llm.csv)
    python benchmarks/hybrid_tables.py   # the tables (instant)

The local-LLM table goes between ``<!-- hybrid-llm:start -->`` and ``<!-- hybrid-llm:end -->``.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "hybrid"
DOC = ROOT / "docs" / "hybrid.md"
START, END = "<!-- hybrid-results:start -->", "<!-- hybrid-results:end -->"
LLM_START, LLM_END = "<!-- hybrid-llm:start -->", "<!-- hybrid-llm:end -->"
DATASETS = [
    ("personabench-0.0", "PB 0.0"),
    ("personabench-0.7", "PB 0.7"),
    ("locomo-turn", "LoCoMo turn"),
    ("locomo-session", "LoCoMo session"),
    ("prefeval-explicit-n10", "PrefEval N=10"),
    ("prefeval-explicit-n50", "PrefEval N=50"),
]
METHODS = [
    "dense",
    "dense+windows",
    "bm25 (no dense tie-break)",
    "bm25 (bm25s)",
    "ensemble RRF",
    "hybrid (no windows)",
    "hybrid",
    "dense + PBR (authors)",
    "hybrid + PBR (authors)",
    "hybrid (no windows) + PBR (authors)",
    "hybrid + PBR (authors), lexical feedback 0.25",
    "hybrid + PBR (authors), lexical feedback 0.5",
]


# Display names: the PBR row without lexical feedback says so; the library defaults are bold.
LABELS = {
    "hybrid": "**hybrid** (default, no LLM)",
    "hybrid + PBR (authors)": "hybrid + PBR (authors), lexical feedback 0",
    "hybrid + PBR (authors), lexical feedback 0.25": (
        "**hybrid + PBR (authors), lexical feedback 0.25** (default)"
    ),
}


def read(name: str) -> list[dict[str, str]]:
    with (RESULTS / name).open() as fh:
        return list(csv.DictReader(fh))


def metric_table(summary: list[dict[str, str]], split: str) -> list[str]:
    cells = {(r["dataset"], r["method"]): r for r in summary if r["split"] == split}
    counts = [next((r["n"] for (d, _), r in cells.items() if d == ds), "") for ds, _ in DATASETS]
    head = "| method | " + " | ".join(f"{label} ({n} q)" for (_, label), n in zip(DATASETS, counts))
    lines = [head + " |", "|---" * (len(DATASETS) + 1) + "|"]
    for method in METHODS:
        row = [cells.get((ds, method)) for ds, _ in DATASETS]
        if not any(row):
            continue
        vals = [f"{float(r['R@5']):.4f} / {float(r['N@5']):.4f}" if r else "" for r in row]
        name = LABELS.get(method, method)
        lines.append(f"| {name} | " + " | ".join(vals) + " |")
    return lines


def paired_table(paired: list[dict[str, str]], split: str) -> list[str]:
    lines = [
        "| data set | comparison | wins / losses / ties | mean ΔR@5 | sign test p |",
        "|---|---|---|---|---|",
    ]
    labels = dict(DATASETS)
    for r in paired:
        if r["split"] != split:
            continue
        lines.append(
            f"| {labels.get(r['dataset'], r['dataset'])} | "
            f"{LABELS.get(r['method'], r['method']).replace('**', '')} vs {r['baseline']} | "
            f"{r['wins']} / {r['losses']} / {r['ties']} | {float(r['mean_delta']):+.4f} | "
            f"{float(r['p_sign']):.2g} |"
        )
    return lines


def llm_table(rows: list[dict[str, str]]) -> list[str]:
    """Per data set and local LLM: the default pipeline with the LLM against the no-LLM hybrid,
    dense and BM25 (R@5 / N@5, LLM calls per question, per-question R@5 wins / losses)."""
    lines = [
        "| data set | LLM | questions | hybrid + PBR | LLM calls / q | no-LLM hybrid "
        "| vs it: W / L, p | dense | bm25 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    labels = dict(DATASETS)
    cells = {(r["dataset"], r["llm"], r["method"]): r for r in rows}
    for ds, llm in dict.fromkeys((r["dataset"], r["llm"]) for r in rows):
        ours, base = cells[(ds, llm, "hybrid + PBR")], cells[(ds, llm, "hybrid (no LLM)")]
        dense, bm25 = cells[(ds, llm, "dense")], cells[(ds, llm, "bm25")]

        def pair(r: dict[str, str]) -> str:
            return f"{float(r['R@5']):.4f} / {float(r['N@5']):.4f}"

        lines.append(
            f"| {labels.get(ds, ds)} | {llm} | {ours['n']} | {pair(ours)} | "
            f"{float(ours['llm_calls_per_q']):.2f} | {pair(base)} | "
            f"{base['pbr_wins']} / {base['pbr_losses']}, {float(base['p_sign']):.2g} | "
            f"{pair(dense)} | {pair(bm25)} |"
        )
    return lines


def diagnostics_table(rows: list[dict[str, str]]) -> list[str]:
    """The pipeline with its gates (and the anchor) switched off, against the no-LLM hybrid."""
    lines = [
        "| data set | LLM | variant | R@5 / N@5 | vs no-LLM hybrid: W / L, mean ΔR@5, p |",
        "|---|---|---|---|---|",
    ]
    labels = dict(DATASETS)
    for r in rows:
        if not r.get("vs_hybrid_wins"):
            continue
        lines.append(
            f"| {labels.get(r['dataset'], r['dataset'])} | {r['llm']} | {r['method']} | "
            f"{float(r['R@5']):.4f} / {float(r['N@5']):.4f} | "
            f"{r['vs_hybrid_wins']} / {r['vs_hybrid_losses']}, "
            f"{float(r['vs_hybrid_mean_delta']):+.4f}, {float(r['vs_hybrid_p_sign']):.2g} |"
        )
    return lines


def replace(text: str, start: str, end: str, body: list[str]) -> str:
    block = "\n".join([start, "", *body, "", end])
    if start in text and end in text:
        before, rest = text.split(start, 1)
        return before + block + rest.split(end, 1)[1]
    return text.rstrip("\n") + "\n\n" + block + "\n"


def main() -> None:
    summary, paired = read("summary.csv"), read("paired.csv")
    body = [
        "R@5 / N@5 on the **test split** (PersonaBench is all test; the tuning split held no",
        "PersonaBench user). `bm25` is pbr's BM25 alone (equal scores in item order, as a plain",
        "BM25 retriever ranks); `bm25 (bm25s)` the committed bm25s baseline (Lucene's 33 stop",
        "words); `ensemble RRF` is LangChain's `EnsembleRetriever` rule (c = 60, equal weights)",
        "over dense and pbr's lexical ranking. PBR rows use the authors' cached gpt-4o-mini",
        "generations (PersonaBench 0.0 only).",
        "",
        *metric_table(summary, "test"),
        "",
        "All questions:",
        "",
        *metric_table(summary, "all"),
        "",
        "Per question, R@5, test split (hybrid minus the other; exact two-sided sign test):",
        "",
        *paired_table(paired, "test"),
    ]
    text = replace(DOC.read_text(encoding="utf-8"), START, END, body)
    if (RESULTS / "llm.csv").exists():
        llm = read("llm.csv")
        body = [
            *llm_table(llm),
            "",
            "What the gates and the anchor do inside the hybrid pipeline (diagnostic variants of",
            "the default, same questions):",
            "",
            *diagnostics_table(llm),
        ]
        verdict = json.loads((RESULTS / "llm.json").read_text())["verdict"]
        body += ["", "Verdict (the issue's goal, data sets with ≥ 200 scored questions):", ""]
        for v in verdict:
            worse = ", ".join(v["significantly_worse"]) or "none"
            body.append(
                f"- {v['llm']}: {', '.join(v['datasets_with_200'])}; significantly below the "
                f"no-LLM hybrid: {worse}; mean ΔR@5 over them "
                f"{v['mean_delta_over_datasets']:+.4f}."
            )
        text = replace(text, LLM_START, LLM_END, body)
    DOC.write_text(text, encoding="utf-8")
    print(f"wrote the tables into {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
