"""The public surface of llamaindex_pbr, pinned."""

from __future__ import annotations

import subprocess
import sys

import llamaindex_pbr

EXPECTED_ALL = [
    "DEFAULT_SIMILARITY_TOP_K",
    "DEFAULT_USER_ID_KEY",
    "EXPLANATION_KEY",
    "LocalGemmaLLM",
    "LocalMiniLMEmbedding",
    "PBRAnchorEvent",
    "PBRDegradedEvent",
    "PBREvent",
    "PBRFusionEvent",
    "PBRPseudoUtterancesEvent",
    "PBRReasoningEvent",
    "PBRRetriever",
    "SalienceNodePostprocessor",
]


def test_all_imports() -> None:
    assert sorted(llamaindex_pbr.__all__) == sorted(EXPECTED_ALL)
    for name in EXPECTED_ALL:
        assert getattr(llamaindex_pbr, name) is not None


def test_import_loads_no_model_library() -> None:
    code = (
        "import sys, llamaindex_pbr; "
        "heavy = [m for m in ('torch', 'transformers', 'sentence_transformers') "
        "if m in sys.modules]; print(heavy); sys.exit(bool(heavy))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
