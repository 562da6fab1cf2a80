"""The ``pbr`` command: ``pbr demo`` (the main job) and ``pbr bench`` (the benchmark harness)."""

from __future__ import annotations

import argparse
import sys

from .config import FUSION_MODES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pbr", description="Personalize Before Retrieve")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="two users, same questions: plain vs personalized top-k")
    demo.add_argument("-k", type=int, default=3, help="results per query (default 3)")
    demo.add_argument("--questions", type=int, default=None, help="ask only the first N")
    demo.add_argument("--cache", default=None, help="generation cache file (JSON Lines)")
    demo.add_argument(
        "--fusion",
        choices=FUSION_MODES,
        default=None,
        help="fusion mode (default: safe; 'paper' applies the paper's full shift)",
    )
    bench = sub.add_parser("bench", help="benchmarks; see `pbr bench --help`", add_help=False)
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run_demo

        run_demo(k=args.k, questions=args.questions, cache_path=args.cache, fusion=args.fusion)
        return 0
    from .bench.cli import main as bench_main

    return bench_main(args.rest)


if __name__ == "__main__":
    sys.exit(main())
