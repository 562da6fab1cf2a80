"""The public surface, pinned: each package's ``__all__`` as a sorted literal.

A name added to or dropped from an ``__all__`` fails here until the list below changes with it,
so the public surface changes only on purpose. Every listed name must also import.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from types import ModuleType

import pytest

EXPECTED_ALL: dict[str, list[str]] = {
    "pbr_core": [
        "AnchorResult",
        "AsyncEmbedder",
        "AsyncTextGenerator",
        "CHAT_PROMPTS",
        "COMPLETION_PROMPTS",
        "Embedder",
        "EmbeddingError",
        "Explanation",
        "FUSION_MODES",
        "FusionMode",
        "FusionResult",
        "GenerationCache",
        "GenerationError",
        "HistoryItem",
        "HistoryStore",
        "HistoryVectorSearch",
        "LLMExecutor",
        "LLMTimeoutError",
        "PBRConfig",
        "PBRError",
        "PersistenceError",
        "PersonalizedQuery",
        "Personalizer",
        "PromptSet",
        "PseudoFeedback",
        "SearchHit",
        "SearchResult",
        "TextGenerator",
        "UnknownUserError",
        "UnknownUserPolicy",
        "UserHistory",
        "VectorSearch",
        "VectorStoreUnavailableError",
        "compute_anchor",
        "fuse",
        "knn_graph",
        "pagerank",
        "parse_reasoning",
        "parse_utterances",
    ],
    "pbr_core.salience": [
        "DEFAULT_TEMPLATE",
        "GateDecision",
        "LogProbScorer",
        "NonFiniteLogProbError",
        "RerankMethod",
        "Reranked",
        "SELECT_OPTIONS",
        "SalienceScores",
        "SalienceSelection",
        "SalienceTemplate",
        "TokenLogProbs",
        "TransformersLogProbScorer",
        "as_scorer",
        "default_scorer",
        "gate",
        "oracle_focus_set",
        "oracle_salience",
        "rerank",
        "salience",
        "select_by_salience",
    ],
    "langchain_pbr": [
        "LocalGemmaChatModel",
        "PBRRetriever",
        "PBRStore",
        "SalienceCompressor",
    ],
    "llamaindex_pbr": [
        "DEFAULT_SIMILARITY_TOP_K",
        "DEFAULT_USER_ID_KEY",
        "EXPLANATION_KEY",
        "LocalGemmaLLM",
        "LocalMiniLMEmbedding",
        "PBRAnchorEvent",
        "PBRDegradedEvent",
        "PBREvent",
        "PBRFusionEvent",
        "PBRMemoryBlock",
        "PBRPseudoUtterancesEvent",
        "PBRReasoningEvent",
        "PBRResultsEvent",
        "PBRRetriever",
        "SalienceNodePostprocessor",
        "tag_nodes",
    ],
}

MODULES = sorted(EXPECTED_ALL)


def _module(name: str) -> ModuleType:
    if name.startswith("langchain_pbr"):
        pytest.importorskip("langchain_core")
    if name.startswith("llamaindex_pbr"):
        pytest.importorskip("llama_index.core")
    return importlib.import_module(name)


@pytest.mark.parametrize("module_name", MODULES)
def test_expected_lists_are_sorted_and_unique(module_name: str) -> None:
    expected = EXPECTED_ALL[module_name]
    assert expected == sorted(set(expected)), f"keep EXPECTED_ALL[{module_name!r}] sorted"


@pytest.mark.parametrize("module_name", MODULES)
def test_all_is_pinned(module_name: str) -> None:
    module = _module(module_name)
    actual = list(module.__all__)
    assert len(actual) == len(set(actual)), f"{module_name}.__all__ lists a name twice"
    expected = EXPECTED_ALL[module_name]
    added = sorted(set(actual) - set(expected))
    dropped = sorted(set(expected) - set(actual))
    assert sorted(actual) == expected, (
        f"the public surface of {module_name} changed: added {added}, dropped {dropped}; "
        "if that is on purpose, update EXPECTED_ALL in this test"
    )


@pytest.mark.parametrize(
    ("module_name", "name"),
    [(module, name) for module in MODULES for name in EXPECTED_ALL[module]],
)
def test_every_public_name_imports(module_name: str, name: str) -> None:
    _module(module_name)
    namespace: dict[str, object] = {}
    exec(f"from {module_name} import {name}", namespace)
    assert namespace[name] is not None


def test_salience_error_is_shared_with_pbr_core_errors() -> None:
    from pbr_core.errors import NonFiniteLogProbError, PBRError
    from pbr_core.salience import NonFiniteLogProbError as from_salience

    assert from_salience is NonFiniteLogProbError
    assert issubclass(NonFiniteLogProbError, PBRError)
    assert issubclass(NonFiniteLogProbError, FloatingPointError)


def test_importing_salience_loads_no_model_library() -> None:
    code = (
        "import sys, pbr_core.salience; "
        "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]; "
        "print(heavy); sys.exit(bool(heavy))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("package", "framework", "extra"),
    [
        ("langchain_pbr", "langchain_core", "langchain"),
        ("llamaindex_pbr", "llama_index", "llamaindex"),
    ],
)
def test_an_adapter_without_its_framework_names_the_extra_to_install(
    package: str, framework: str, extra: str
) -> None:
    """A base install (`pip install personalize-before-retrieve`) failed on ``import
    langchain_pbr`` with a bare ``No module named 'langchain_core'`` from a submodule."""
    code = f"import sys; sys.modules[{framework!r}] = None; import {package}"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert run.returncode != 0
    assert f"pip install 'personalize-before-retrieve[{extra}]'" in run.stderr
