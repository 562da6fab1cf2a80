"""The benchmark tables in the docs, generated from the committed result files.

Why: numbers typed by hand drift from the results they quote. Each table is a function of the
committed CSVs under ``benchmarks/results/``, registered under a name; a Markdown file holds it
between ``<!-- table:NAME -->`` and ``<!-- /table:NAME -->`` (the same table may appear in
several files). Rewriting a result file and running

    python -m pbr_bench tables            # rewrite every marked table in README.md and docs/
    python -m pbr_bench tables --check    # exit 1 if any table differs from its results

keeps the docs true; the test suite runs ``--check``. Bold marks the best value of a column.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .paths import REPO_ROOT, RESULTS_DIR

RESULTS = RESULTS_DIR
DOCS = (REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md")))
TABLES: dict[str, Callable[[Path], list[str]]] = {}
_BLOCK = re.compile(r"(<!-- table:([\w.-]+) -->\n)(.*?)(<!-- /table:\2 -->)", re.S)


def table(name: str) -> Callable[[Callable[[Path], list[str]]], Callable[[Path], list[str]]]:
    """Register a table generator: ``results folder -> Markdown lines``."""

    def register(fn: Callable[[Path], list[str]]) -> Callable[[Path], list[str]]:
        if name in TABLES:
            raise ValueError(f"table {name!r} is registered twice")
        TABLES[name] = fn
        return fn

    return register


def read(results: Path, name: str) -> list[dict[str, str]]:
    """The rows of ``results/<name>`` (a CSV)."""
    with (results / name).open(encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def pick(rows: Iterable[dict[str, str]], **where: str) -> dict[str, str]:
    """The one row whose columns equal ``where``; a missing or ambiguous row is an error."""
    hits = [r for r in rows if all(r.get(k) == v for k, v in where.items())]
    if len(hits) != 1:
        raise LookupError(f"{len(hits)} rows match {where}")
    return hits[0]


def dec(value: str | float) -> str:
    """``0.3783`` → ``.3783`` (four decimals, the leading zero dropped as in the papers)."""
    text = f"{float(value):.4f}"
    return text[1:] if text.startswith("0.") else text


def p_value(value: str | float) -> str:
    return f"{float(value):.2g}"


@dataclass(frozen=True)
class Row:
    """One table row: a result row (a CSV under the results folder and the columns that pick
    it) and, optionally, the per-question record against plain from a paired CSV."""

    label: str
    file: str
    where: dict[str, str]
    paired: str | None = None  # a paired_vs_plain CSV (its ``method`` is ``<method>__<llm>``)
    extra: tuple[str, ...] = field(default=())  # further fixed cells (e.g. the paper's numbers)

    def result(self, results: Path) -> dict[str, str]:
        """The result row this table row shows."""
        return pick(read(results, self.file), **self.where)

    def record(self, results: Path, result: dict[str, str]) -> str:
        """``wins / losses (p)`` against plain, from the paired CSV or else the ``result`` row
        itself, or ``—`` for a row without one."""
        found = result
        if self.paired is not None:
            key = f"{self.where['method']}__{self.where['llm']}"
            found = pick(read(results, self.paired), method=key)
        elif not found.get("wins"):
            return "—"
        return f"{found['wins']} / {found['losses']} (p {p_value(found['sign_p'])})"


def bold_best(columns: list[list[float]]) -> list[list[str]]:
    """Format each column, bolding its maximum (every tie)."""
    out = []
    for col in columns:
        best = max(col)
        out.append([f"**{dec(v)}**" if v == best else dec(v) for v in col])
    return out


def method_table(
    results: Path,
    rows: list[Row],
    metrics: list[str],
    *,
    head: str = "method",
    extra_heads: tuple[str, ...] = (),
    record: str | None = "wins / losses vs plain (sign test)",
) -> list[str]:
    """One row per method: its metrics (best bold), fixed extra cells, its paired record."""
    found = [r.result(results) for r in rows]
    values = [[float(f[m]) for m in metrics] for f in found]
    cols = bold_best([list(c) for c in zip(*values, strict=True)])
    heads = [head, *metrics, *extra_heads, *([record] if record else [])]
    lines = ["| " + " | ".join(heads) + " |", "|---" * len(heads) + "|"]
    for i, row in enumerate(rows):
        cells = [row.label, *(c[i] for c in cols), *row.extra]
        if record:
            cells.append(row.record(results, found[i]))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


# -- the harness's tables (python -m pbr_bench run / compare) --------------------------------------

PB0 = "personabench-0.0"
#: the paper's Table (PersonaBench noise 0.0, all-MiniLM-L6-v2, gpt-4o-mini): R@5 / N@5
PAPER_PB0 = {
    "plain": ".3783 / .3074",
    "authors-settings": ".4516 / .3855",
    "no-anchor": ".4382 / .3729",
    "no-prf": ".2860 / .2449 (θ .7, k2 10, α 1)",
}


def _run(
    folder: str, tag: str, method: str, llm: str, label: str, extra: tuple[str, ...] = ()
) -> Row:
    """A row of ``<folder>/summary__<tag>.csv`` with its record in the folder's paired file;
    ``plain`` has no record (it is what the others are compared with)."""
    paired = None if method == "plain" else f"{folder}/paired_vs_plain__none.csv"
    where = {"method": method, "llm": llm}
    return Row(label, f"{folder}/summary__{tag}.csv", where, paired, extra)


@table("personabench-authors")
def personabench_authors(results: Path) -> list[str]:
    """The reproduction: PersonaBench 0.0 with the authors' gpt-4o-mini generations."""
    a = "authors"
    rows = [
        _run(PB0, a, "plain", "none", "plain query", extra=(PAPER_PB0["plain"] + " (exact)",)),
        _run(PB0, a, "bm25", "none", "BM25", extra=("—",)),
        Row(
            "PBR, the authors' settings (θ .7, k2 10, α 1)",
            f"{PB0}/sweep__pbr__authors.csv",
            {"alpha": "1.0", "theta": "0.7", "k2": "10"},
            extra=(PAPER_PB0["authors-settings"],),
        ),
        _run(
            PB0,
            a,
            "pbr",
            a,
            "PBR, paper fusion, library anchor defaults (θ .65, k2 5, α .85)",
            extra=("—",),
        ),
        _run(PB0, a, "pbr-no-anchor", a, "PBR without P-Anchor", extra=(PAPER_PB0["no-anchor"],)),
        _run(
            PB0,
            a,
            "pbr-no-prf",
            "none",
            "PBR without P-PRF (q + anchor)",
            extra=(PAPER_PB0["no-prf"],),
        ),
        _run(PB0, a, "pbr-no-utterances", a, "PBR without utterances", extra=("—",)),
        _run(PB0, a, "pbr-no-reasoning", a, "PBR without reasoning", extra=("—",)),
        _run(PB0, a, "pbr-safe", a, "**PBR, library defaults** (`safe` fusion)", extra=("—",)),
    ]
    return method_table(results, rows, ["R@5", "N@5"], extra_heads=("paper R@5 / N@5",))


def _pair(row: dict[str, str]) -> str:
    return f"{dec(row['R@5'])} / {dec(row['N@5'])}"


@table("personabench-noise")
def personabench_noise(results: Path) -> list[str]:
    """PersonaBench at each noise level, the authors' generations, library defaults."""
    methods = [
        ("plain", "none", "plain"),
        ("bm25", "none", "BM25"),
        ("pbr", "authors", "PBR, paper fusion"),
        ("pbr-safe", "authors", "PBR, `safe` (default)"),
        ("pbr-no-prf", "none", "q + anchor (no P-PRF)"),
    ]
    heads = [
        "noise",
        *(m[2] for m in methods),
        "paper-fusion wins / losses (p)",
        "`safe` W / L (p)",
    ]
    lines = ["| " + " | ".join(heads) + " |", "|---" * len(heads) + "|"]
    for noise in ("0.0", "0.3", "0.5", "0.7"):
        folder = f"personabench-{noise}"
        summary = read(results, f"{folder}/summary__authors.csv")
        paired = read(results, f"{folder}/paired_vs_plain__none.csv")
        cells = [_pair(pick(summary, method=m, llm=llm)) for m, llm, _ in methods]
        records = [
            (lambda r: f"{r['wins']} / {r['losses']} ({p_value(r['sign_p'])})")(
                pick(paired, method=f"{m}__authors")
            )
            for m in ("pbr", "pbr-safe")
        ]
        lines.append(f"| {noise} | " + " | ".join([*cells, *records]) + " |")
    return lines


@table("postgres-verify")
def postgres_verify(results: Path) -> list[str]:
    """The per-query verification over PostgreSQL next to PGVector's search
    (``benchmarks/postgres_verify.py``)."""
    label = {
        "check": "verification, nothing changed (the revision read)",
        "list": "verification by listing the user's rows (revision read off)",
        "search": "PGVector's own search, `k=10`, filtered by user",
        "changed": "verification after another writer changed one row (re-list, 1 row read)",
        "add": "adding 1k items of a user (one upsert), with pbr's revision trigger",
        "add_no_trigger": "the same add with the trigger disabled",
    }
    lines = ["| one user of 1k items among 10 users | median ms | × search |", "|---|---|---|"]
    for row in read(results, "postgres_verify.csv"):
        ratio = "—" if row["step"].startswith("add") else f"{float(row['vs_search']):.3f}"
        lines.append(f"| {label[row['step']]} | {float(row['ms_per_query']):.2f} | {ratio} |")
    return lines


@table("fleet-postgres")
def fleet_postgres(results: Path) -> list[str]:
    """Two workers over 1M PGVector rows: pbr's query, warm and cold, next to the plain
    owner-filtered search and PGVector's own (``benchmarks/fleet_postgres.py``)."""
    label = {
        "warm_plain": "plain pgvector search, owner-filtered through the owner index, `k=10`",
        "warm_pbr": "pbr query (`no_prf`), warm user: revision read + anchor + hybrid ranking",
        "warm_pgvector_own": "`PGVector.similarity_search_by_vector(filter={'user_id': u})`",
        "cold_plain": "plain search, next to the cold queries",
        "cold_pbr": "pbr query, a user no worker read before (rows read, anchor and BM25 built "
        "and shared)",
        "cold_pgvector_own": "`PGVector`'s own filtered search, next to the cold queries",
        "shared_plain": "plain search, next to the shared-state queries",
        "shared_pbr": "pbr query, a user new to this worker whose state another worker shared "
        "(ranked in the database)",
        "shared_pgvector_own": "`PGVector`'s own filtered search, next to the shared-state queries",
    }
    lines = [
        "| two workers, one user of 1k items among 1,000 | n | p50 ms | p95 ms "
        "| p50 × plain | p95 × plain |",
        "|---|---|---|---|---|---|",
    ]
    for row in read(results, "fleet_postgres.csv"):
        if row["section"] != "query":
            continue
        lines.append(
            f"| {label[row['what']]} | {row['n']} | {float(row['p50_ms']):.1f} "
            f"| {float(row['p95_ms']):.1f} | {float(row['p50_x_plain']):.2f} "
            f"| {float(row['p95_x_plain']):.2f} |"
        )
    return lines


@table("fleet-postgres-cold")
def fleet_postgres_cold(results: Path) -> list[str]:
    """Where a cold query's time goes over PGVector (``benchmarks/fleet_postgres.py``)."""
    label = {
        "first_read_user": "a user no worker read: the one read of rows, vectors, token, state",
        "first_history": "its whole cold read (`Corpus.history`: that read, then the cache)",
        "first_lexical_index": "then its BM25 index built",
        "first_anchor": "then its anchor built (kNN graph, PageRank)",
        "first_share_state": "then the derived state shared (`pbr_states`, one write)",
        "first_query_rest": "then the rest of the query",
        "shared_read_user": "a user another worker shared: the same one read",
        "shared_history": "its whole cold read (the derived state taken, checked)",
        "shared_lexical_index": "then its BM25 index (taken: nothing to build)",
        "shared_anchor": "then its anchor (taken)",
        "shared_share_state": "then sharing (nothing to share)",
        "shared_query_rest": "then the rest of the query",
        "plain": "the plain owner-filtered search",
    }
    lines = ["| a cold user of 1k items, one process | n | p50 ms | × plain |", "|---|---|---|---|"]
    for row in read(results, "fleet_postgres.csv"):
        if row["section"] != "cold_parts":
            continue
        lines.append(
            f"| {label[row['what']]} | {row['n']} | {float(row['p50_ms']):.1f} "
            f"| {float(row['p50_x_plain']):.2f} |"
        )
    return lines


def _against_plain(results: Path, cell: str, method: str) -> str:
    """`` (wins / losses vs plain on R@5, p sign)`` of ``method`` in ``cell``'s paired file."""
    row = pick(read(results, f"{cell}/paired_vs_plain__none.csv"), method=f"{method}__none")
    return f" ({row['wins']} / {row['losses']}, p {p_value(row['sign_p'])})"


@table("prefeval-no-llm")
def prefeval_no_llm(results: Path) -> list[str]:
    """PrefEval explicit preferences among N fillers, no LLM: R@1 / R@5, and per-question R@5
    wins / losses against plain with the sign test."""
    methods = [("plain", "plain"), ("bm25", "BM25"), ("pbr-no-prf", "q + anchor")]
    heads = ["N fillers", *(f"{label} R@1 / R@5" for _, label in methods)]
    lines = ["| " + " | ".join(heads) + " |", "|---" * len(heads) + "|"]
    for n in (10, 50, 100, 300):
        cell = f"prefeval-explicit-n{n}"
        summary = read(results, f"{cell}/summary__none.csv")
        cells = []
        for m, _ in methods:
            r = pick(summary, method=m)
            paired = "" if m == "plain" else _against_plain(results, cell, m)
            cells.append(f"{dec(r['R@1'])} / {dec(r['R@5'])}{paired}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return lines


@table("locomo-no-llm")
def locomo_no_llm(results: Path) -> list[str]:
    """LoCoMo's 1,536 questions without an LLM: R@5 / N@5, and per-question R@5 wins / losses
    against plain with the sign test."""
    lines = [
        "| LoCoMo (1,536 questions), R@5 / N@5 | plain | BM25 | anchor only (no LLM) |",
        "|---|---|---|---|",
    ]
    for level, label in (
        ("turn", "turn level (5,882 turns)"),
        ("session", "session level (272 sessions)"),
    ):
        cell = f"locomo-{level}"
        summary = read(results, f"{cell}/summary__none.csv")
        cells = []
        for m in ("plain", "bm25", "pbr-no-prf"):
            r = pick(summary, method=m)
            paired = "" if m == "plain" else _against_plain(results, cell, m)
            cells.append(f"{dec(r['R@5'])} / {dec(r['N@5'])}{paired}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


@table("personabench-gemma")
def personabench_gemma(results: Path) -> list[str]:
    """PersonaBench 0.0 with the embedded Gemma 3 270M as the LLM (all 230 questions)."""
    g, t = "gemma-270m", "local"
    rows = [
        _run(PB0, t, "plain", "none", "plain query"),
        _run(PB0, t, "pbr", g, "PBR, paper fusion"),
        _run(PB0, t, "pbr-safe", g, "**PBR, `safe` fusion (default)**"),
        Row(
            "PBR, `safe` fusion without the history gate",
            "safe_report.csv",
            {"dataset": PB0, "llm": g, "fusion": "safe, no gate"},
        ),
        _run(PB0, t, "pbr-no-anchor", g, "without P-Anchor"),
        _run(PB0, t, "pbr-no-utterances", g, "without utterances"),
        _run(PB0, t, "pbr-no-reasoning", g, "without reasoning"),
        _run(PB0, t, "pbr-no-prf", "none", "without P-PRF (q + anchor)"),
        _run(PB0, t, "bm25", "none", "BM25"),
    ]
    return method_table(
        results,
        rows,
        ["R@5", "N@5"],
        head="method (230 questions)",
        record="wins / losses vs plain (sign test p)",
    )


@table("personabench-0.7-small-llms")
def personabench_07_small_llms(results: Path) -> list[str]:
    """PersonaBench 0.7 with both small local LLMs: R@5 / N@5 (R@5 wins / losses vs plain)."""
    folder = "personabench-0.7"
    paired = read(results, f"{folder}/paired_vs_plain__none.csv")
    tags = ("local", "smollm2")
    summaries = {tag: read(results, f"{folder}/summary__{tag}.csv") for tag in tags}
    methods = [
        ("plain", "plain query"),
        ("pbr", "PBR, paper fusion"),
        ("pbr-safe", "**PBR, `safe` fusion (default)**"),
        ("pbr-no-anchor", "without P-Anchor"),
        ("pbr-no-utterances", "without utterances"),
        ("pbr-no-reasoning", "without reasoning"),
        ("pbr-no-prf", "without P-PRF (q + anchor)"),
        ("bm25", "BM25"),
    ]
    lines = [
        "| method (230 questions), R@5 / N@5 (R@5 wins / losses vs plain, sign test p) "
        "| Gemma 3 270M | SmolLM2-135M |",
        "|---|---|---|",
    ]
    for method, label in methods:
        cells = []
        for tag in tags:
            row = next(r for r in summaries[tag] if r["method"] == method)
            text = _pair(row)
            if method != "plain":
                rec = pick(paired, method=f"{method}__{row['llm']}")
                text += f" ({rec['wins']} / {rec['losses']}, p {p_value(rec['sign_p'])})"
            cells.append(text)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


@table("headline-gemma")
def headline_gemma(results: Path) -> list[str]:
    """The README's one sentence on the embedded Gemma (PersonaBench 0.0)."""
    summary = read(results, f"{PB0}/summary__local.csv")
    safe, paper = pick(summary, method="pbr-safe"), pick(summary, method="pbr")
    rec = pick(read(results, f"{PB0}/paired_vs_plain__none.csv"), method="pbr-safe__gemma-270m")
    sentence = (
        "With the embedded Gemma 3 270M in place of gpt-4o-mini (dense search, as above), `safe` "
        f"fusion (the default) reaches R@5 {dec(safe['R@5'])} / N@5 {dec(safe['N@5'])} on the "
        f"same questions ({rec['wins']} wins / {rec['losses']} losses against plain, p "
        f"{p_value(rec['sign_p'])}) where the paper's fusion gets {dec(paper['R@5'])} / "
        f"{dec(paper['N@5'])}."
    )
    return textwrap.wrap(sentence, width=100)


_LLM_LABELS = {
    "authors (gpt-4o-mini)": "gpt-4o-mini, authors",
    "gemma-270m": "Gemma 3 270M",
    "smollm2-135m": "SmolLM2-135M",
}
_DATASET_LABELS = {
    "personabench-0.0": "PersonaBench 0.0",
    "personabench-0.7": "PersonaBench 0.7",
    "locomo-turn": "LoCoMo turn",
    "prefeval-explicit-n10": "PrefEval, N = 10",
    "prefeval-explicit-n50": "PrefEval, N = 50",
}


@table("safe-report")
def safe_report(results: Path) -> list[str]:
    """Plain, the paper's fusion and `safe` fusion per data set and LLM source
    (``benchmarks/safe_report.py``); held-out cells marked, pooled LoCoMo rows bold."""
    from .safe import HELD_OUT

    held = {(name, seed) for name, _, seed in HELD_OUT}
    rows = read(results, "safe_report.csv")
    modes = ("plain", "paper", "safe, no gate", "safe")
    lines = [
        "| data set | LLM source (questions) | plain | paper fusion | safe, no gate "
        "| **safe (default)** |",
        "|---|---|---|---|---|---|",
    ]
    groups = dict.fromkeys((r["dataset"], r["llm"], r["seed"], r["questions"]) for r in rows)
    for ds, llm, seed, n in groups:
        cells = {
            r["fusion"]: r for r in rows if (r["dataset"], r["llm"], r["seed"]) == (ds, llm, seed)
        }
        label = _DATASET_LABELS.get(ds, ds)
        if seed == "all":
            label = f"**{label}, every question answered** (pooled)"
        elif ds.startswith("locomo"):
            label = f"{label} (seed {seed})"
        if seed != "all" and (ds, int(seed)) in held:
            label = f"*held out:* {label}"
        out = []
        for mode in modes:
            r = cells[mode]
            text = _pair(r)
            if r["wins"] not in ("", None):  # a paired cell: its wins, losses and p, always
                text += f" ({r['wins']} / {r['losses']}, p {float(r['sign_p']):.2g})"
            out.append(text)
        lines.append(f"| {label} | {_LLM_LABELS.get(llm, llm)} ({n}) | " + " | ".join(out) + " |")
    return lines


@table("output-budget")
def output_budget(results: Path) -> list[str]:
    """Safe fusion with Gemma's answers cut to the chosen budget against the 160-token answers,
    per cell (``benchmarks/output_budget.py``): its held-out questions and all of them."""
    payload = json.loads((results / "output_budget.json").read_text())
    chosen, rows = payload["chosen"], payload["rows"]
    by = {(r["cell"], r["split"], r["budget"]): r for r in rows}

    def rec(r: dict[str, Any]) -> str:
        return f"{r['wins']} / {r['losses']}, {r['dR@5_vs_160']:+.4f}, {p_value(r['sign_p'])}"

    lines = [
        f"| cell | questions (test / all) | R@5 / N@5, 160 tokens | R@5 / N@5, {chosen} tokens "
        "| test: W / L, ΔR@5, p | all: W / L, ΔR@5, p |",
        "|---|---|---|---|---|---|",
    ]
    for cell in dict.fromkeys(r["cell"] for r in rows):
        a160, anew, tnew = (
            by[(cell, "all", 160)],
            by[(cell, "all", chosen)],
            by[(cell, "test", chosen)],
        )
        lines.append(
            f"| {cell} | {tnew['n']} / {anew['n']} | {_pair(a160)} | {_pair(anew)} "
            f"| {rec(tnew)} | {rec(anew)} |"
        )
    return lines


# -- docs/deployment.md (python benchmarks/cache_budget.py) --------------------------------------
@table("cache-budget")
def cache_budget(results: Path) -> list[str]:
    """One worker serving many distinct users under ``max_cache_bytes``: memory along the way
    (``benchmarks/cache_budget.py``)."""
    payload = json.loads((results / "cache_budget.json").read_text())
    rows = payload["rows"]
    step = max(1, len(rows) // 5)
    shown = rows[step - 1 :: step]
    if shown[-1] is not rows[-1]:
        shown.append(rows[-1])
    lines = [
        "| users served | RSS (MB) | `cached_bytes` (MB) | users resident | evicted "
        "| an unbudgeted worker would hold (MB) |",
        "|---|---|---|---|---|---|",
    ]
    for r in shown:
        lines.append(
            f"| {r['users_served']:,} | {r['rss_mb']:,.0f} | {r['cached_mb']:,.1f} "
            f"| {r['resident_users']:,} | {r['evictions']:,} | {r['unbudgeted_mb']:,.0f} |"
        )
    return lines


@table("cache-budget-summary")
def cache_budget_summary(results: Path) -> list[str]:
    """The same run's totals: memory at the start and the peak, a warm user's bytes, the time
    per request, and the sampled rankings against an unbudgeted worker's."""
    summary = json.loads((results / "cache_budget.json").read_text())["summary"]
    return [
        "| users × items (dim) | budget | RSS at start | peak RSS | bytes per warm user "
        "| ms per request | sampled rankings equal to an unbudgeted worker's |",
        "|---|---|---|---|---|---|---|",
        f"| {summary['users']:,} × {summary['items_per_user']} ({summary['dim']}) "
        f"| {summary['budget_mb']:.0f} MB | {summary['rss_start_mb']:.0f} MB "
        f"| {summary['peak_rss_mb']:.0f} MB | {summary['bytes_per_warm_user']:,} "
        f"| {summary['ms_per_request']} | {summary['sample_rankings_equal']} / "
        f"{summary['sample']} ({summary['sample_reread']} re-read after eviction) |",
    ]


# -- docs/hybrid.md (python benchmarks/hybrid.py, benchmarks/hybrid_llm.py) ----------------------

HYBRID = "hybrid"
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


def hybrid_metric_table(summary: list[dict[str, str]], split: str) -> list[str]:
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


def hybrid_paired_table(paired: list[dict[str, str]], split: str) -> list[str]:
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


def hybrid_llm_table(rows: list[dict[str, str]]) -> list[str]:
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


def hybrid_diagnostics_table(rows: list[dict[str, str]]) -> list[str]:
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


@table("hybrid-results")
def hybrid_results(results: Path) -> list[str]:
    """The no-LLM and authors' rows of every data set, test split and all questions."""
    summary, paired = read(results, "hybrid/summary.csv"), read(results, "hybrid/paired.csv")
    return [
        "R@5 / N@5 on the **test split** (the split #42's rule was tuned on: on PersonaBench the",
        "144 of 230 questions it did not tune on). `bm25` is pbr's BM25 alone (equal scores in",
        "item order, as a plain",
        "BM25 retriever ranks); `bm25 (bm25s)` the committed bm25s baseline (Lucene's 33 stop",
        "words); `ensemble RRF` is LangChain's `EnsembleRetriever` rule (c = 60, equal weights)",
        "over dense and pbr's lexical ranking. PBR rows use the authors' cached gpt-4o-mini",
        "generations (PersonaBench 0.0 only).",
        "",
        *hybrid_metric_table(summary, "test"),
        "",
        "All questions:",
        "",
        *hybrid_metric_table(summary, "all"),
        "",
        "recall_any@5 (a question counts as found when any of its gold items is in the top 5;",
        "= R@5 where a question has one gold item), all questions, beside LoCoMo on every",
        "question with evidence (`-all`: the adversarial category 5 included, the set",
        "published memory-system numbers use):",
        "",
        *hybrid_any_table(summary, "all"),
        "",
        "Per question, R@5, test split (hybrid minus the other; exact two-sided sign test):",
        "",
        *hybrid_paired_table(paired, "test"),
    ]


ANY_DATASETS = [
    *DATASETS,
    ("locomo-turn-all", "LoCoMo turn, all"),
    ("locomo-session-all", "LoCoMo session, all"),
]


def hybrid_any_table(summary: list[dict[str, str]], split: str) -> list[str]:
    """recall_any@5 of every method, the six data sets and LoCoMo's full question set."""
    cells = {(r["dataset"], r["method"]): r for r in summary if r["split"] == split}
    shown = [(ds, label) for ds, label in ANY_DATASETS if (ds, "dense") in cells]
    head = "| method | " + " | ".join(
        f"{label} ({cells[(ds, 'dense')]['n']} q)" for ds, label in shown
    )
    lines = [head + " |", "|---" * (len(shown) + 1) + "|"]
    for method in METHODS:
        row = [cells.get((ds, method)) for ds, _ in shown]
        if not any(row):
            continue
        vals = [f"{float(r['recall_any@5']):.4f}" if r else "" for r in row]
        lines.append(f"| {LABELS.get(method, method)} | " + " | ".join(vals) + " |")
    return lines


@table("hybrid-stemming")
def hybrid_stemming(results: Path) -> list[str]:
    """benchmarks/stemming.py: every data set, unstemmed -> stemmed, per split."""
    data = json.loads((results / "hybrid" / "stemming.json").read_text())
    summary, paired, verdict = data["summary"], data["paired"], data["verdict"]
    labels = dict(ANY_DATASETS)
    metrics = ("R@5", "N@5", "recall_any@5")
    score = {(r["split"], r["dataset"], r["method"], r["analyzer"]): r for r in summary}
    sign = {(r["split"], r["dataset"], r["method"], r["metric"]): r for r in paired}
    lines: list[str] = []
    for split, title in (
        ("tune", "Tuning split (decides)"),
        ("test", "Test split"),
        ("all", "All questions"),
    ):
        lines += [
            f"{title}: without → with stemming, stemmed wins / losses (sign test p):",
            "",
            "| data set | method | questions | R@5 | N@5 | recall_any@5 |",
            "|---|---|---|---|---|---|",
        ]
        for (sp, ds, method, analyzer), r in score.items():
            if sp != split or analyzer != "stemmed":
                continue
            base = score[(sp, ds, method, "unstemmed")]
            cells = []
            for m in metrics:
                t = sign[(sp, ds, method, m)]
                cells.append(
                    f"{base[m]:.4f} → {r[m]:.4f} ({t['wins']} / {t['losses']}, {t['p_sign']:.2g})"
                )
            lines.append(
                f"| {labels.get(ds, ds)} | {method} | {r['n']} | " + " | ".join(cells) + " |"
            )
        lines.append("")
    means = verdict["tuning mean of hybrid R@5 and N@5 over the six data sets"]
    worse = verdict["test split: hybrid R@5 worse on the mean or significantly (n >= 200)"]
    lines += [
        "The rule on the tuning split: hybrid's mean of R@5 and N@5 over the six data sets "
        f"{means['unstemmed']:.4f} without, {means['stemmed']:.4f} with stemming; significant "
        f"losses there: {len(verdict['tuning split: significant losses of hybrid (R@5 or N@5)'])}"
        f"; picks stemming: {'yes' if verdict['rule picks stemming'] else 'no'}. Test split, "
        "data sets where hybrid R@5 is worse on the mean or significantly: "
        + (", ".join(labels.get(w[0], w[0]) for w in worse) or "none")
        + ". Stemming becomes the default: "
        + ("**yes**." if verdict["stemming becomes the default"] else "**no**."),
    ]
    return lines


#: benchmarks/hybrid_tuning.py: what the tuning table shows, in order (the shipped rule and the
#: choice, then what each of the choice's three changes does alone or left out, then the best
#: stemmed candidates: nearest to admissible and best on the objective).
TUNING_ROWS = [
    "dense",
    "bm25",
    "rrf",
    "plain k1=1.5 b=0.75, w=c^0.5",
    "plain k1=0.5 b=0.25, w=c^0.5",
    "plain k1=0.5 b=0.25, w=1.5c^1",
    "plain k1=0.5 b=0.25, w=c^0.5, nbr α=0.5",
    "plain k1=1.5 b=0.75, w=1.5c^1, nbr α=0.5",
    "plain k1=0.5 b=0.25, w=1.5c^1, nbr α=0.5",
    "stem k1=0.25 b=0.25, w=2c^1, c: default analyzer",
    "stem k1=0.25 b=0.25, w=3c^0.5, nbr α=0.5",
]
TUNING_SETS = [
    *DATASETS,
    ("prefeval-explicit-n100", "PrefEval N=100"),
    ("prefeval-explicit-n300", "PrefEval N=300"),
]


@table("hybrid-tuning")
def hybrid_tuning(results: Path) -> list[str]:
    """benchmarks/hybrid_tuning.py: candidates on the tuning split, the choice's paired test."""
    data = json.loads((results / "hybrid" / "tuning.json").read_text())
    recs = {r["candidate"]: r for r in data["candidates"]}
    labels = {"plain k1=1.5 b=0.75, w=c^0.5": "default (today: plain k1=1.5 b=0.75, w=√c)"}
    chosen = data["chosen"]["label"]
    default_fails = data["default's fails"]
    lines = [
        "Tuning split: R@5 / N@5; LoCoMo on every question with evidence (`-all`):"
        " recall_any@5; goal: the objective (mean of the four conversation numbers); fails:"
        " cells below max(dense, bm25, rrf); sig.: significant losses (p < .05) against"
        " dense, bm25, rrf or the default:",
        "",
        "| candidate | "
        + " | ".join(label for _, label in TUNING_SETS)
        + " | turn, all | session, all | goal | fails | sig. |",
        "|---" * (len(TUNING_SETS) + 6) + "|",
    ]
    for name in TUNING_ROWS:
        r = recs[name]
        shown = labels.get(name, name)
        if name == chosen:
            shown = f"**{shown}** (chosen)"
        cells = [f"{dec(r[f'{d} R@5'])} / {dec(r[f'{d} N@5'])}" for d, _ in TUNING_SETS]
        cells += [dec(r[f"{d} recall_any@5"]) for d in ("locomo-turn-all", "locomo-session-all")]
        cells.append(dec(r["objective"]))
        cells += [str(r.get("fails", "")), str(r.get("sig. losses", ""))]
        lines.append(f"| {shown} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"{sum('fails' in r for r in data['candidates'])} hybrid parameter sets over"
        f" {len(data['analyzers'])} analyzers (and BM25 alone under each); admissible (no"
        " significant loss, at most the"
        f" default's {default_fails} fails): {data['admissible']}. Chosen:"
        f" **{chosen}**.",
        "",
        "Test split, the choice against each baseline: value vs baseline (wins / losses, sign"
        " test p):",
        "",
        "| data set | metric | vs dense | vs bm25 | vs rrf | vs default |",
        "|---|---|---|---|---|---|",
    ]
    paired = {
        (r["dataset"], r["metric"], r["baseline"]): r
        for r in data["paired"]
        if r["split"] == "test"
    }
    added = [
        ("personabench-0.3", "PB 0.3 (added after the choice)"),
        ("personabench-0.5", "PB 0.5 (added after the choice)"),
    ]
    for d, label in [*TUNING_SETS, *ANY_DATASETS[-2:], *added]:
        for metric in ("R@5", "N@5", "recall_any@5"):
            if (metric == "recall_any@5") != d.endswith("-all"):
                continue
            cells = []
            for b in ("dense", "bm25", "rrf", "default"):
                t = paired[(d, metric, b)]
                cells.append(
                    f"{dec(t['value'])} vs {dec(t['baseline_value'])}"
                    f" ({t['wins']} / {t['losses']}, {p_value(t['p_sign'])})"
                )
            lines.append(f"| {label} | {metric} | " + " | ".join(cells) + " |")
    return lines


@table("hybrid-llm")
def hybrid_llm(results: Path) -> list[str]:
    """The default pipeline with each small local LLM against the no-LLM hybrid."""
    llm = read(results, "hybrid/llm.csv")
    body = [
        *hybrid_llm_table(llm),
        "",
        "What the gates, the anchor and each leg's feedback do inside the hybrid pipeline",
        "(diagnostic variants of the default, same questions):",
        "",
        *hybrid_diagnostics_table(llm),
    ]
    verdict = json.loads((results / "hybrid" / "llm.json").read_text())["verdict"]
    body += ["", "Verdict (the issue's goal, data sets with ≥ 200 scored questions):", ""]
    for v in verdict:
        worse = ", ".join(v["significantly_worse"]) or "none"
        body.append(
            f"- {v['llm']}: {', '.join(v['datasets_with_200'])}; significantly below the "
            f"no-LLM hybrid: {worse}; mean ΔR@5 over them "
            f"{v['mean_delta_over_datasets']:+.4f}."
        )
    return body


@table("pre-gate-margin")
def pre_gate_margin(results: Path) -> list[str]:
    """A second pre-generation signal: every candidate on the tuning and the test split."""
    data = json.loads((results / "hybrid" / "pre_gate_margin.json").read_text())
    summary, chosen = data["summary"], data["chosen_on_tuning_split"]
    picked = (chosen["signal"], chosen["threshold"])
    by_split: dict[str, dict[tuple[str, float], dict[str, Any]]] = {}
    for s in summary:
        by_split.setdefault(s["split"], {})[(s["signal"], s["threshold"])] = s
    keys = list(by_split["tune"])
    cols = [
        [by_split[split][k]["mean_delta_over_cells"] for k in keys] for split in ("tune", "test")
    ]
    best = [max(c) for c in cols]
    lines = [
        "| candidate | tuning: mean ΔR@5, calls / q | test: mean ΔR@5, calls / q |",
        "|---|---|---|",
    ]
    for k in keys:
        name = "none (today's default)" if k[0] == "none" else f"`{k[0]}` ≥ {k[1]:g}"
        if k == picked:
            name += " (picked by the rule)"
        cells = []
        for i, split in enumerate(("tune", "test")):
            s = by_split[split][k]
            delta = f"{s['mean_delta_over_cells']:+.4f}"
            if s["mean_delta_over_cells"] == best[i]:
                delta = f"**{delta}**"
            cells.append(f"{delta}, {s['calls_per_q']:.2f}")
        lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
    return lines


# -- docs/agent-memory.md (python benchmarks/agent_memory.py --windows 1,2,3) ---------------------
@table("agent-memory-window")
def agent_memory_window(results: Path) -> list[str]:
    """PBRMemoryBlock's query window: R@5 / N@5 per split and each window against the old 5."""
    data = json.loads((results / "agent_memory" / "window.json").read_text(encoding="utf-8"))
    rows, paired, chosen = data["rows"], data["paired"], data["chosen"]
    baseline = data["meta"]["baseline"]
    lines = [
        f"| window | R@5 tune | R@5 test | N@5 test | R@5 all | vs {baseline[7:]} (all, R@5): "
        "wins / losses (p) |",
        "|---|---|---|---|---|---|",
    ]
    for window in data["meta"]["windows"]:
        name = f"window {window}"
        cell = {split: pick(rows, store=name, split=split) for split in ("tune", "test", "all")}
        label = f"**{window}** (default, chosen)" if name == chosen else str(window)
        if name == baseline:
            label += " (before #39)"
            record = "—"
        else:
            r = pick(paired, window=name, split="all", metric="R@5")
            record = f"{r['wins']} / {r['losses']} (p {p_value(r['p_sign'])})"
        lines.append(
            f"| {label} | {dec(cell['tune']['R@5'])} | {dec(cell['test']['R@5'])} | "
            f"{dec(cell['test']['N@5'])} | {dec(cell['all']['R@5'])} | {record} |"
        )
    return lines


# -- rendering ------------------------------------------------------------------------------------


def render(text: str, results: Path = RESULTS) -> tuple[str, list[str]]:
    """``text`` with every marked table regenerated, and the names of the tables in it.

    An unknown table name is an error (a typo would otherwise leave stale numbers in place).
    """
    names: list[str] = []

    def fill(m: re.Match[str]) -> str:
        name = m[2]
        if name not in TABLES:
            raise KeyError(f"no table named {name!r} (known: {', '.join(sorted(TABLES))})")
        names.append(name)
        return m[1] + "\n" + "\n".join(TABLES[name](results)) + "\n\n" + m[4]

    return _BLOCK.sub(fill, text), names


def cmd_tables(args: argparse.Namespace) -> int:
    """Rewrite (or, with ``--check``, compare) every marked table in README.md and docs/."""
    stale, used = [], set()
    for doc in DOCS:
        old = doc.read_text(encoding="utf-8")
        new, names = render(old)
        used.update(names)
        if new != old:
            stale.append(str(doc.relative_to(REPO_ROOT)))
            if not args.check:
                doc.write_text(new, encoding="utf-8")
    unused = sorted(set(TABLES) - used)
    if unused:
        print(f"registered but in no document: {', '.join(unused)}")
        return 1
    verb = "differ from their results" if args.check else "rewritten"
    print(f"{len(used)} tables; {len(stale)} files {verb}: {', '.join(stale) or 'none'}")
    return 1 if args.check and stale else 0


@table("hybrid-scores")
def hybrid_scores(results: Path) -> list[str]:
    """benchmarks/hybrid_scores.py: how well the top result's score separates, per data set."""
    data = json.loads((results / "hybrid" / "scores.json").read_text())
    rows = data["rows"]
    labels = dict(DATASETS)
    taus = data["thresholds (tuning, pooled)"]
    variants = list(taus)

    def num(x: float | None) -> str:
        return "–" if x is None else f"{x:.2f}"

    lines: list[str] = []
    for split, title in (("test", "Test split"), ("tune", "Tuning split"), ("all", "All")):
        shown = [r for r in rows if r["split"] == split]
        if not shown:
            continue
        lines += [
            f"{title}. Each cell: AUC gold / AUC other user; balanced accuracy at the tuned τ, "
            "gold / other user:",
            "",
            "| data set | questions | top-1 gold | " + " | ".join(variants) + " |",
            "|---|---|---|" + "---|" * len(variants),
        ]
        for ds in dict.fromkeys(r["dataset"] for r in shown):
            cell = {r["variant"]: r for r in shown if r["dataset"] == ds}
            first = next(iter(cell.values()))
            parts = [
                f"{num(cell[v]['AUC gold'])} / {num(cell[v]['AUC other user'])}; "
                f"{num(cell[v].get('balanced accuracy at tau (gold)'))} / "
                f"{num(cell[v].get('balanced accuracy at tau (other)'))}"
                for v in variants
            ]
            lines.append(
                f"| {labels.get(ds, ds)} | {first['questions']} | {first['top-1 gold']} | "
                + " | ".join(parts)
                + " |"
            )
        lines.append("")
    lines.append(
        "τ (tuning split, pooled), gold / other user: "
        + "; ".join(
            f"{v} {taus[v]['gold']['tau']:.3f} / {taus[v]['other']['tau']:.3f}" for v in variants
        )
        + f". The protocol's rule (mean AUC gold, tuning split) chose "
        f"**{data['chosen on the tuning split']}** ("
        + ", ".join(f"{v} {m:.3f}" for v, m in data["tuning mean AUC gold"].items())
        + ")."
    )
    return lines


@table("salience-rerank")
def salience_rerank(results: Path) -> list[str]:
    """benchmarks/salience_rerank.py: the hybrid top 10 re-ranked, per data set."""
    data = json.loads((results / "salience_rerank.json").read_text())
    lines = [
        "| data set | candidates → order | questions | R@1 | R@5 | N@5 | R@5 wins / losses (p) "
        "| s / query (median) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    labels = dict(DATASETS)
    for r in data["rows"]:
        sign = f"{r['R@5 wins']} / {r['R@5 losses']} ({r['R@5 p']:.2g})" if "R@5 wins" in r else "–"
        lines.append(
            f"| {labels.get(r['dataset'], r['dataset'])} | {r['method']} | {r['questions']} | "
            f"{r['R@1']:.4f} | {r['R@5']:.4f} | {r['N@5']:.4f} | {sign} | "
            f"{r['salience s/query (median)']:.1f} |"
        )
    lines += [
        "",
        "Paired against `hybrid` (sign test, ties dropped), R@1 / N@5: "
        + "; ".join(
            f"{labels.get(r['dataset'], r['dataset'])} {r['method']}: R@1 "
            f"{r['R@1 wins']} / {r['R@1 losses']} ({r['R@1 p']:.2g}), N@5 "
            f"{r['N@5 wins']} / {r['N@5 losses']} ({r['N@5 p']:.2g})"
            for r in data["rows"]
            if "R@1 wins" in r
        )
        + ".",
    ]
    return lines


@table("hybrid-frontier")
def hybrid_frontier(results: Path) -> list[str]:
    """benchmarks/hybrid_frontier.py: every #42 no-LLM candidate against the goals."""
    data = json.loads((results / "hybrid" / "frontier.json").read_text())
    pe = "prefeval-explicit-n300 N@5"
    line, shipped = data["targets' mean"], data["shipped"]
    lines = [
        "Tuning split; goals' mean: the mean of the four LoCoMo goal numbers (the targets':"
        f" {dec(line)}; the shipped rule: {dec(shipped['goal mean'])}); PrefEval: N = 300,"
        f" N@5 (dense: {dec(data['dense ' + pe])}, the shipped rule: {dec(shipped[pe])}):",
        "",
        "| script | candidates | admissible | best goals' mean, admissible | best goals' mean"
        " (significant losses; PrefEval) | reach the targets' mean (admissible) |",
        "|---|---|---|---|---|---|",
    ]
    for name, v in [*data["per source"].items(), ("all", data["all"])]:
        ok, best = v["best admissible"], v["best"]
        reach, reach_ok = v["reach the targets' mean"], v["of them admissible"]
        shown = "**all**" if name == "all" else f"`{name}.py`"
        lines.append(
            f"| {shown} | {v['candidates']} | {v['admissible']} | "
            f"{dec(ok['goal mean']) if ok else '–'} | {dec(best['goal mean'])} ({best['losses']};"
            f" {dec(best[pe])}) | {reach} ({reach_ok}) |"
        )
    lines += [
        "",
        "| goal (every question) | target | shipped (tuning split) | best admissible | best of"
        " any (its significant losses) |",
        "|---|---|---|---|---|",
    ]
    for key, g in data["per goal"].items():
        losses = g["best candidate's losses"]
        lines.append(
            f"| {key} | {g['target']:.2f} | {dec(g['shipped'])} | {dec(g['best admissible'])}"
            f" ({g['best admissible candidate']}) | {dec(g['best'])} ({g['best candidate']};"
            f" {losses}) |"
        )
    return lines


@table("hybrid-pairs-share")
def hybrid_pairs_share(results: Path) -> list[str]:
    """benchmarks/pairs_share.py: what a share or rarity gate on a matched pair would keep."""
    data = json.loads((results / "hybrid" / "pairs_share.json").read_text())
    lines = [
        f"Tuning split; the questions whose N@5 the pairs-as-weight choice (γ = {data['gamma']:g},"
        f" δ = {data['delta']:g}) moved against the shipped rule (LoCoMo: turn and session, every"
        " question with evidence), kept by each gate:",
        "",
        "| gate on the best pair item | LoCoMo won | LoCoMo lost | PrefEval won | PrefEval lost |",
        "|---|---|---|---|---|",
    ]
    for g in data["gates"]:
        lines.append(
            f"| {g['gate']} | {g['LoCoMo won']} | {g['LoCoMo lost']} | {g['PrefEval won']} |"
            f" {g['PrefEval lost']} |"
        )
    return lines
