"""``python -m pbr_bench ...``: the benchmark harness's command line (see :mod:`pbr_bench.cli`)."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
