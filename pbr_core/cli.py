"""The ``pbr`` command: ``pbr demo`` (the main job).

``pbr bench ...`` is kept for now: it forwards to the benchmark harness, ``python -m pbr_bench``,
its own distribution in the source checkout (``benchmarks/``), not part of the library's wheel.
The harness is imported only when ``pbr bench`` runs, never when this module is imported.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from .config import FUSION_MODES

BENCH_MISSING = (
    "the benchmark harness is not installed; in a source checkout, `make install` (or "
    "`pip install -e benchmarks`) installs it, then: python -m pbr_bench ..."
)


def _bench_main() -> Callable[[list[str]], int]:
    """``pbr_bench.cli.main``, or SystemExit saying how to run the harness when it is absent
    (an installed wheel without the checkout's ``benchmarks/`` distribution)."""
    try:
        from pbr_bench.cli import main as bench_main
    except ModuleNotFoundError as exc:
        if exc.name != "pbr_bench":
            raise
        raise SystemExit(f"pbr bench: {BENCH_MISSING}") from None
    return bench_main


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else list(argv)
    if args_in[:1] == ["bench"]:  # everything after it is the harness's, `--help` included
        return _bench_main()(args_in[1:])
    parser = argparse.ArgumentParser(prog="pbr", description="Personalize Before Retrieve")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="two users, same questions: plain vs personalized top-k")
    demo.add_argument("-k", type=_positive, default=3, help="results per query (default 3)")
    demo.add_argument("--questions", type=_positive, default=None, help="ask only the first N")
    demo.add_argument(
        "--cache",
        type=_cache_file,
        default=None,
        help="generation cache file, JSON Lines (default: generations.jsonl in $PBR_CACHE, else "
        "~/.cache/pbr)",
    )
    demo.add_argument(
        "--fusion",
        choices=FUSION_MODES,
        default=None,
        help="fusion mode (default: safe; 'paper' applies the paper's full shift)",
    )
    bench = sub.add_parser(
        "bench", help="benchmarks (source checkout): same as `python -m pbr_bench`", add_help=False
    )
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(args_in)
    if args.command == "demo":
        from .demo import run_demo

        try:
            run_demo(k=args.k, questions=args.questions, cache_path=args.cache, fusion=args.fusion)
        except ImportError as exc:  # an embedded model's package is missing: say which, briefly
            raise SystemExit(f"pbr demo: {exc}") from None
        return 0
    return _bench_main()(args.rest)


def _cache_file(text: str) -> str:
    """An argparse type: a file path, not a folder (checked before any model loads)."""
    from .cache import check_cache_file

    try:
        check_cache_file(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _positive(text: str) -> int:
    """An argparse type: an integer >= 1 (checked before any model loads)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


if __name__ == "__main__":
    sys.exit(main())
