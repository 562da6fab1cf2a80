"""``python -m pbr_bench``: run methods on the benchmark data sets, sweep the anchor parameters.

Run from a source checkout (the harness is not part of the library wheel).

Examples:
    python -m pbr_bench run --dataset personabench --noise 0.0 --llm authors
    python -m pbr_bench run --dataset locomo --level turn --llm local --limit 100
    python -m pbr_bench sweep --dataset personabench --noise 0.0 --llm authors
    python -m pbr_bench reproduce --cell personabench-0.0   # rerun committed runs, compare
    python -m pbr_bench tables                              # the docs' tables from the results
    python -m pbr_bench experiments                         # every benchmark script, by name
    python -m pbr_bench experiment gemma_latency --queries 4
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from . import runs


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pbr_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    runs.add_commands(sub)
    r = sub.add_parser("reproduce", help="rerun every committed run from the caches, compare")
    r.add_argument("--cell", default=None, help="only cells whose path contains this")
    r.add_argument(
        "--write", action="store_true", help="rerun into benchmarks/results (replace the files)"
    )
    sub.add_parser("experiments", help="list the benchmark scripts (benchmarks/*.py)")
    e = sub.add_parser("experiment", help="run one benchmark script by name")
    e.add_argument("name", help="a script of benchmarks/ without .py (see `experiments`)")
    e.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    t = sub.add_parser("tables", help="rewrite the docs' benchmark tables from the results")
    t.add_argument("--check", action="store_true", help="exit 1 if any table is out of date")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from . import experiments
    from .doctables import cmd_tables
    from .reproduce import cmd_reproduce

    commands = {
        **runs.COMMANDS,
        "reproduce": cmd_reproduce,
        "tables": cmd_tables,
        "experiments": lambda _: experiments.list_experiments(),
        "experiment": lambda a: experiments.run(a.name, a.args),
    }
    return commands[args.command](args)


__all__ = ["build_parser", "main"]
