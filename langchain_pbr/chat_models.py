"""The embedded local model (Gemma 3 270M, offline) as a LangChain chat model."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from langchain_core.callbacks import (
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel, LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import ConfigDict, Field, field_validator

from pbr_core.models import DEFAULT_MAX_NEW_TOKENS

if TYPE_CHECKING:
    from pbr_core.models import LocalGemmaGenerator

__all__ = ["LocalGemmaChatModel", "flatten_messages"]

_ROLE_NAMES = {"human": "User", "ai": "Assistant", "system": "System", "tool": "Tool"}


def flatten_messages(messages: Sequence[BaseMessage]) -> str:
    """One completion prompt from chat messages, for a base model that continues documents.

    A single message is passed through verbatim (that is how PBR's completion prompts arrive).
    Several become a transcript, one ``"Role: text"`` paragraph each, ending with
    ``"Assistant:"`` so the model continues as the assistant.
    """
    if len(messages) == 1:
        return messages[0].text
    lines = [f"{_ROLE_NAMES.get(m.type, m.type.title())}: {m.text}" for m in messages]
    return "\n\n".join([*lines, "Assistant:"])


class LocalGemmaChatModel(BaseChatModel):
    """The embedded Gemma 3 270M of ``pbr_core`` as a LangChain chat model (offline, CPU).

    Gemma 3 270M here is a *base* model: it continues text rather than follows instructions.
    Messages are flattened into one completion prompt (:func:`flatten_messages`) and
    ``prompt_style = "completion"`` tells :class:`~langchain_pbr.PBRRetriever` to use PBR's
    numbered-list prompts with it. Sampling is seeded from the prompt, so a prompt always gives
    the same text. The weights load on the first call, once per process.

    Setup:
        .. code-block:: bash

            pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu   # first
            pip install 'personalize-before-retrieve[langchain,local]'

    Instantiate:
        .. code-block:: python

            from langchain_pbr import LocalGemmaChatModel

            llm = LocalGemmaChatModel(max_new_tokens=64)

    Invoke:
        .. code-block:: python

            llm.invoke("Three things to pack for a rainy hike:\\n1.").text

    Stream:
        .. code-block:: python

            for chunk in llm.stream("Three things to pack for a rainy hike:\\n1."):
                print(chunk.text, end="")   # the same text as invoke, as it is decoded

    Async:
        .. code-block:: python

            await llm.ainvoke("...")

    Use in PBR:
        .. code-block:: python

            from langchain_pbr import PBRRetriever

            retriever = PBRRetriever(llm=LocalGemmaChatModel())  # == PBRRetriever(llm=None)
    """

    max_new_tokens: int = Field(default=DEFAULT_MAX_NEW_TOKENS, ge=1, alias="max_tokens")
    """Most tokens generated per call (``max_tokens=`` works too, as for other chat models)."""
    temperature: float = Field(default=0.8, gt=0)
    top_p: float = Field(default=0.95, gt=0, le=1)
    top_k: int = Field(default=64, ge=1)
    repetition_penalty: float = Field(default=1.1, gt=0)
    dtype: Literal["bfloat16", "float32", "float16"] = "bfloat16"
    """Weights' dtype: ``"bfloat16"`` decodes fastest on CPU; ``"float32"`` shares the salience
    scorer's copy of the model."""
    stop: list[str] | None = None
    """Stop strings of every call (a call's own ``stop`` replaces them); None = pbr's default
    (a blank line, or the next numbered item for a list)."""
    prompt_style: Literal["completion"] = "completion"
    #: In-process compute: pbr gives it no ``llm_timeout_s`` (its first call loads the model).
    in_process: ClassVar[bool] = True
    """Read by :class:`~langchain_pbr.PBRRetriever`: this model needs completion prompts."""

    model_config = ConfigDict(populate_by_name=True)

    @property
    def _llm_type(self) -> str:
        return "pbr-local-gemma"

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = LangSmithParams(
            ls_provider="pbr",
            ls_model_name=kwargs.get("model", "gemma-3-270m"),
            ls_model_type="chat",
            ls_temperature=self.temperature,
            ls_max_tokens=self.max_new_tokens,
        )
        if stop or self.stop:
            params["ls_stop"] = list(stop or self.stop or [])
        return params

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "repetition_penalty": self.repetition_penalty,
            "dtype": self.dtype,
            "stop": self.stop,  # it changes the text: LangChain's LLM cache keys by these
        }

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, stop: list[str] | None) -> list[str] | None:
        if stop is not None and not all(isinstance(s, str) and s for s in stop):
            raise ValueError("stop strings must be non-empty strings")
        return stop

    @property
    def model_id(self) -> str:
        """The generator's id: every setting that changes the text (a generation-cache key)."""
        return self._generator(None).model_id

    def _generator(self, stop: list[str] | None) -> LocalGemmaGenerator:
        # Cheap to build (the weights are cached per process in pbr_core.models), so each call
        # gets one with its own stop strings instead of sharing mutable state.
        from pbr_core.models import DEFAULT_STOP, LocalGemmaGenerator

        stop = stop or self.stop
        return LocalGemmaGenerator(
            max_new_tokens=self.max_new_tokens,
            stop=tuple(stop) if stop else DEFAULT_STOP,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            repetition_penalty=self.repetition_penalty,
            dtype=self.dtype,
        )

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        text = self._generator(stop).generate(flatten_messages(messages))
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text))])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        for piece in self._generator(stop).stream(flatten_messages(messages)):
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=piece))
            if run_manager is not None:
                run_manager.on_llm_new_token(piece, chunk=chunk)
            yield chunk

    # No _agenerate of its own: the forward passes are sync compute. LangChain runs them in a
    # worker thread for ainvoke, and PBRRetriever calls them in its own bounded executor.
