"""The embedded local model (Gemma 3 270M, offline) as a LlamaIndex LLM."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from llama_index.core.base.llms.generic_utils import completion_response_to_chat_response
from llama_index.core.llms import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    CustomLLM,
    LLMMetadata,
)
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from pydantic import Field

from pbr_core.models import DEFAULT_MAX_NEW_TOKENS

if TYPE_CHECKING:
    from pbr_core.models import LocalGemmaGenerator

__all__ = ["LocalGemmaLLM"]

#: Gemma 3 270M's context length, in tokens.
_CONTEXT_WINDOW = 32_768


class LocalGemmaLLM(CustomLLM):
    """The embedded Gemma 3 270M of ``pbr_core`` as a LlamaIndex ``LLM`` (offline, CPU).

    Gemma 3 270M here is a *base* model: it continues text rather than follows instructions, so
    ``prompt_style = "completion"`` tells :class:`~llamaindex_pbr.PBRRetriever` to use PBR's
    numbered-list prompts with it, and chat messages are flattened into one prompt. Sampling is
    seeded from the prompt, so a prompt always gives the same text; a completion stops at the
    first blank line. The weights load on the first call, once per process.

    Setup:
        .. code-block:: bash

            pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu   # first
            pip install 'personalize-before-retrieve[llamaindex,local]'

    Instantiate:
        .. code-block:: python

            from llamaindex_pbr import LocalGemmaLLM

            llm = LocalGemmaLLM(max_new_tokens=64)

    Complete:
        .. code-block:: python

            llm.complete("Three things to pack for a rainy hike:\\n1.").text

    Async:
        .. code-block:: python

            (await llm.acomplete("...")).text   # decodes in a worker thread

    Use in PBR:
        .. code-block:: python

            from llamaindex_pbr import PBRRetriever

            retriever = PBRRetriever.from_defaults(nodes=nodes, llm=LocalGemmaLLM())
    """

    #: Read by :class:`~llamaindex_pbr.PBRRetriever`: this model needs completion prompts.
    prompt_style: ClassVar[str] = "completion"
    #: In-process compute: pbr gives it no ``llm_timeout_s`` (its first call loads the model).
    in_process: ClassVar[bool] = True

    max_new_tokens: int = Field(
        default=DEFAULT_MAX_NEW_TOKENS, ge=1, description="Most tokens generated per call."
    )
    temperature: float = Field(default=0.8, gt=0)
    top_p: float = Field(default=0.95, gt=0, le=1)
    top_k: int = Field(default=64, ge=1)
    repetition_penalty: float = Field(default=1.1, gt=0)
    stop: Sequence[str] = Field(
        default=("\n\n",), description="A completion ends before the first of these strings."
    )
    dtype: Literal["bfloat16", "float32", "float16"] = Field(
        default="bfloat16",
        description='"bfloat16" decodes fastest on CPU; "float32" shares the salience '
        "scorer's copy of the model.",
    )

    @classmethod
    def class_name(cls) -> str:
        return "LocalGemmaLLM"

    def _generator(self) -> LocalGemmaGenerator:
        # Cheap to build (the weights are cached per process in pbr_core.models), so each call
        # gets one from the current field values instead of a cached, possibly stale one.
        from pbr_core.models import LocalGemmaGenerator

        return LocalGemmaGenerator(
            max_new_tokens=self.max_new_tokens,
            stop=tuple(self.stop),
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            repetition_penalty=self.repetition_penalty,
            dtype=self.dtype,
        )

    @property
    def model_id(self) -> str:
        """Every setting that changes the text (PBR's generation-cache key)."""
        return self._generator().model_id

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(
            context_window=_CONTEXT_WINDOW,
            num_output=self.max_new_tokens,
            is_chat_model=False,
            model_name=self.model_id,
        )

    def _prompt(self, prompt: str, formatted: bool) -> str:
        if formatted or self.completion_to_prompt is None:
            return prompt
        return self.completion_to_prompt(prompt)

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """The continuation of ``prompt`` (prompt excluded), cut at the first stop string."""
        return CompletionResponse(text=self._generator().generate(self._prompt(prompt, formatted)))

    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        """:meth:`complete` with the forward passes in a worker thread (the loop keeps serving)."""
        text = await asyncio.to_thread(self._generator().generate, self._prompt(prompt, formatted))
        return CompletionResponse(text=text)

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        """:meth:`complete`'s text in pieces as it is decoded (``delta``: the new piece)."""
        pieces = self._generator().stream(self._prompt(prompt, formatted))

        def gen() -> CompletionResponseGen:
            text = ""
            for piece in pieces:
                text += piece
                yield CompletionResponse(text=text, delta=piece)

        return gen()

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        response = await self.acomplete(prompt, formatted=formatted, **kwargs)

        async def gen() -> CompletionResponseAsyncGen:
            yield CompletionResponse(text=response.text, delta=response.text)

        return gen()

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Chat without blocking the event loop (CustomLLM's default calls the sync path)."""
        assert self.messages_to_prompt is not None  # set by LLM's validator
        prompt = self.messages_to_prompt(messages)
        response = await self.acomplete(prompt, formatted=True, **kwargs)
        return completion_response_to_chat_response(response)

    @llm_chat_callback()
    async def astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> ChatResponseAsyncGen:
        """Streamed chat without blocking the event loop (CustomLLM's default runs the sync
        stream on it): the whole answer, decoded in a worker thread, as one piece."""
        response = await self.achat(messages, **kwargs)

        async def gen() -> ChatResponseAsyncGen:
            yield ChatResponse(message=response.message, delta=response.message.content)

        return gen()
