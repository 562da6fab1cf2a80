"""Importing llamaindex_pbr loads no model library (its public names: test_public_surface.py)."""

from __future__ import annotations

import subprocess
import sys


def test_import_loads_no_model_library() -> None:
    code = (
        "import sys, llamaindex_pbr; "
        "heavy = [m for m in ('torch', 'transformers', 'sentence_transformers') "
        "if m in sys.modules]; print(heavy); sys.exit(bool(heavy))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
