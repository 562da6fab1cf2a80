"""Translation between LangChain's objects and pbr_core's protocols (no rule of its own)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Literal

from langchain_core.callbacks import Callbacks
from langchain_core.documents import Document
from langchain_core.language_models import BaseLanguageModel, BaseLLM
from langchain_core.prompts import PromptTemplate
from langchain_core.runnables import Runnable, RunnableConfig

from pbr_core import HistoryItem, PromptSet
from pbr_core.adapters_support import declared_model_id, model_id, result_metadata
from pbr_core.config import ExplainMode
from pbr_core.corpus import held_item_id, stored_timestamp
from pbr_core.items import check_batch, id_or_new
from pbr_core.prf import PROMPT_VARIABLES, prompts_for_style, resolve_prompt_style, template_from
from pbr_core.retrieval import Retrieval

#: The variables a PBR prompt template may use (the core fills them in).
_REQUIRED_VARIABLES = ("history", "query")


def prompt_style_of(llm: object, style: str | None) -> Literal["chat", "completion"]:
    """The prompt style: the one given, else the LLM's ``prompt_style``, else what LangChain
    knows of it: a text-completion model (``BaseLLM``) the numbered-list prompts, anything
    else (a chat model, a Runnable) the JSON ones; LlamaIndex reads ``is_chat_model`` alike."""
    model = underlying_model(llm)
    fallback: Literal["chat", "completion"] = "completion" if isinstance(model, BaseLLM) else "chat"
    return resolve_prompt_style(getattr(model, "prompt_style", None), style, fallback)


def prompt_set(
    style: Literal["chat", "completion"],
    utterances: PromptTemplate | None,
    reasoning: PromptTemplate | None,
) -> PromptSet:
    """pbr_core's prompts: the given templates, else the style's defaults."""
    base = prompts_for_style(style)
    return PromptSet(
        utterances=core_template(utterances) or base.utterances,
        reasoning=core_template(reasoning) or base.reasoning,
        style=style,
    )


def check_prompt(prompt: PromptTemplate | None) -> PromptTemplate | None:
    """``prompt`` if it uses ``{history}`` and ``{query}`` (optionally ``{m}``) and nothing else."""
    if prompt is None:
        return None
    variables = set(prompt.input_variables)
    unknown = sorted(variables - set(PROMPT_VARIABLES))
    missing = [v for v in _REQUIRED_VARIABLES if v not in variables]
    if unknown or missing:
        raise ValueError(
            f"a PBR prompt template uses {{history}} and {{query}}, optionally {{m}}; this "
            f"one has unknown variable(s) {unknown} and lacks {missing} "
            "(bind anything else with partial_variables)"
        )
    return prompt


class LangChainGenerator:
    """One request's :class:`~pbr_core.protocols.TextGenerator` over a LangChain model.

    It carries that request's callbacks, so each LLM call is a child run of the retriever run;
    it is built per request and never shared. It has no ``agenerate``: a model without native
    async would run its sync code in asyncio's default executor, where a hung call holds a
    thread pbr cannot account for. pbr then calls :meth:`generate` in its own bounded executor.
    """

    def __init__(
        self,
        llm: LanguageModelLike,
        callbacks: Callbacks,
        prompt_style: str,
        configurable: dict[str, Any] | None = None,
        answering: list[Any] | None = None,
    ) -> None:
        self.llm = llm
        self.callbacks = callbacks
        # the request's config["configurable"], as a child run of the retriever gets it
        self.config: RunnableConfig = {"callbacks": callbacks}
        if configurable:
            self.config["configurable"] = dict(configurable)
        self.prompt_style = prompt_style
        model = underlying_model(llm)
        self.model_id = model_id(model)  # keys pbr_core's generation cache
        # No one id names what answers (see answers_as_model), or the model declares none
        # (its class name, which two models share): no answer is cached, since it would be
        # served for another model's.
        self.cacheable = answers_as_model(llm) and declared_model_id(model) is not None
        # in-process (no timeout: pbr_core.generation.timeout_for) only if every model that
        # may answer is: a remote fallback of the embedded model can hang on its network
        models = answering if answering is not None else answering_models(llm)
        self.in_process = all(bool(getattr(m, "in_process", False)) for m in models)

    def generate(self, prompt: str) -> str:
        return text_of(self.llm.invoke(prompt, config=self.config))


class AsyncLangChainGenerator(LangChainGenerator):
    """:class:`LangChainGenerator` over a model with native async: awaited, and cancelled at
    pbr's timeout."""

    async def agenerate(self, prompt: str) -> str:
        return text_of(await self.llm.ainvoke(prompt, config=self.config))


def generator_for(
    llm: LanguageModelLike,
    callbacks: Callbacks,
    prompt_style: str,
    configurable: dict[str, Any] | None = None,
) -> LangChainGenerator:
    """The generator of one request: async only where the model is natively async (the models
    that may answer found once, for that and for ``in_process``)."""
    models = answering_models(llm)
    cls = AsyncLangChainGenerator if natively_async(models) else LangChainGenerator
    return cls(llm, callbacks, prompt_style, configurable, models)


def natively_async(models: Sequence[Any]) -> bool:
    """Whether a call's ``ainvoke`` runs its models' own async code (not their sync code in a
    thread), for every model that may answer (``models``, :func:`answering_models`: a
    fallback too).

    A chat model counts when its class overrides ``_agenerate`` (``_acall`` for an ``LLM``,
    ``_agenerate`` for a ``BaseLLM``): that is what ``ainvoke`` awaits. An ``_astream`` override
    alone does not count: ``ainvoke`` does not stream, so it would run the sync ``_generate`` in
    asyncio's default executor, the application's shared pool, where a hung call holds a thread
    pbr cannot bound. A Runnable pbr cannot find a model in counts as sync (its ``ainvoke``
    may run sync code in that pool too): pbr's own bounded executor runs it.
    """
    return all(_natively_async_model(m) for m in models)


def _natively_async_model(model: Any) -> bool:
    from langchain_core.language_models import BaseChatModel, BaseLLM, SimpleChatModel
    from langchain_core.language_models.llms import LLM

    cls = type(model)
    if isinstance(model, BaseChatModel):  # SimpleChatModel's too runs _generate in that pool
        return cls._agenerate not in (BaseChatModel._agenerate, SimpleChatModel._agenerate)
    if isinstance(model, LLM):
        return cls._acall is not LLM._acall
    if isinstance(model, BaseLLM):
        return cls._agenerate is not BaseLLM._agenerate
    return False


def answering_models(llm: Any) -> list[Any]:
    """Every model that may answer a call of ``llm``: the one :func:`underlying_model` finds,
    and each fallback's (``with_fallbacks``) and alternative's (``configurable_alternatives``),
    found the same way; ``llm`` itself where none is found."""
    from langchain_core.runnables import RunnableWithFallbacks
    from langchain_core.runnables.configurable import RunnableConfigurableAlternatives

    found = [underlying_model(llm)]
    for _ in range(8):
        if isinstance(llm, RunnableWithFallbacks):
            for fallback in llm.fallbacks:
                found += answering_models(fallback)
        if isinstance(llm, RunnableConfigurableAlternatives):
            for other in llm.alternatives.values():
                if isinstance(other, Runnable):  # a factory is built only when picked
                    found += answering_models(other)
        for _, branch in _branches(llm):  # a RunnableBranch: each branch may answer
            found += answering_models(branch)
        if isinstance(llm, BaseLanguageModel):
            break
        steps = _steps(llm)
        if steps is not None:
            for step in steps:
                found += [m for m in answering_models(step) if isinstance(m, BaseLanguageModel)]
            break
        llm = _wrapped(llm)
        if llm is None:
            break
    unique: dict[int, Any] = {id(m): m for m in found}
    return list(unique.values())


#: A chat model / LLM, or a Runnable around one (``with_retry()``, ``with_fallbacks()``,
#: ``bind()``, ``with_config()``, configurable alternatives): anything that turns a prompt string
#: into a message or a string.
LanguageModelLike = BaseLanguageModel | Runnable[Any, Any]


def underlying_model(llm: Any) -> Any:
    """The model inside Runnable wrappers (``bound``, ``runnable``, ``default``) and chains
    (``model | StrOutputParser()``: its first step that holds a model), for its identity (cache
    key), whether it is natively async, and ``prompt_style``; the wrapper itself is what gets
    invoked. The Runnable itself where no model is found."""
    for _ in range(8):
        if isinstance(llm, BaseLanguageModel):  # a model: no wrapper attributes to probe (a
            return llm  # missing attribute of a pydantic model costs microseconds per probe)
        steps = _steps(llm)
        if steps is not None:  # a RunnableSequence
            found = (underlying_model(step) for step in steps)
            return next((m for m in found if isinstance(m, BaseLanguageModel)), llm)
        inner = _wrapped(llm)
        if inner is None:
            return llm
        llm = inner
    return llm


def answers_as_model(llm: Any) -> bool:
    """Whether every answer of ``llm`` is the own answer of the one model
    :func:`underlying_model` finds, so that model's name may key cached answers.

    Not where another model may answer: the run's config picks it (``configurable_fields``,
    ``configurable_alternatives``), the input does (a ``RunnableBranch``), a failure does
    (``with_fallbacks``), or a chain holds two (``a | parser | b``: the last one answers). Nor
    where the answer is not the model's own: a ``bind()`` changes how it answers (``model=``,
    ``stop``, ``temperature``, tools), a step before it rewrites the prompt (a prompt template,
    a lambda), or one after it rewrites the answer (anything but ``StrOutputParser`` itself,
    which takes its text), anywhere in its wrappers or steps. Two such runnables around one
    model would otherwise share its cached answers.
    """
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.runnables import RunnableBinding, RunnableWithFallbacks
    from langchain_core.runnables.configurable import DynamicRunnable

    def plain_parser(step: Any) -> bool:
        while isinstance(step, RunnableBinding) and not step.kwargs:  # with_config()
            step = step.bound
        return type(step) is StrOutputParser  # a subclass may rewrite the text

    for _ in range(8):
        if isinstance(llm, BaseLanguageModel):
            return True
        if isinstance(llm, DynamicRunnable | RunnableWithFallbacks) or _branches(llm):
            return False
        if isinstance(llm, RunnableBinding) and llm.kwargs:
            return False
        steps = _steps(llm)
        if steps is not None:
            return answers_as_model(steps[0]) and all(plain_parser(s) for s in steps[1:])
        llm = _wrapped(llm)
        if llm is None:  # a Runnable of the user's: what it does to the prompt is unknown
            return False
    return False


def _branches(llm: Any) -> list[tuple[Any, Any]]:
    """A ``RunnableBranch``'s ``(condition, runnable)`` pairs, else none."""
    branches = getattr(llm, "branches", None)
    return list(branches) if isinstance(branches, list | tuple) else []


def _steps(llm: Any) -> list[Any] | None:
    """A ``RunnableSequence``'s steps, else None."""
    steps = getattr(llm, "steps", None)
    return steps if isinstance(steps, list) else None


def _wrapped(llm: Any) -> Any:
    """The Runnable a wrapper holds (``bound``: ``bind()``, ``with_config()``; ``runnable``:
    ``with_retry()``, ``with_fallbacks()``; ``default``: configurable ones), else None."""
    return next(
        (getattr(llm, a) for a in ("bound", "runnable", "default") if hasattr(llm, a)), None
    )


def text_of(out: Any) -> str:
    """A chat model's message or an LLM's string as text (content blocks concatenated)."""
    return out if isinstance(out, str) else str(out.text)


_DEFAULT_LLM: BaseLanguageModel | None = None
_DEFAULT_LLM_LOCK = threading.Lock()


def default_llm() -> BaseLanguageModel:
    """The process-wide :class:`~langchain_pbr.LocalGemmaChatModel` (loads on first call)."""
    global _DEFAULT_LLM
    with _DEFAULT_LLM_LOCK:
        if _DEFAULT_LLM is None:
            from .chat_models import LocalGemmaChatModel

            _DEFAULT_LLM = LocalGemmaChatModel()
        return _DEFAULT_LLM


def core_template(prompt: PromptTemplate | None) -> str | None:
    """A LangChain prompt template as a pbr_core template (``{history}`` etc. left to fill).

    The template is rendered by LangChain itself (any template format, partial variables
    included) with sentinels in place of the PBR variables; literal braces are then escaped so
    that pbr_core fills only the variables.
    """
    if prompt is None:
        return None
    return template_from(
        lambda values: prompt.format(**{v: values[v] for v in prompt.input_variables})
    )


def items_of(
    documents: Sequence[Document],
    user_id: str,
    ids: Sequence[str] | None,
    user_key: str,
    *,
    held: bool = False,
) -> list[HistoryItem]:
    """The documents as items of ``user_id``: their ids are ``ids``, else their own
    ``Document.id`` (a new one where neither gives one: :func:`~pbr_core.items.id_or_new`);
    ``held``, documents the store holds already, read back from it: one pbr wrote is its user's
    item of the id its metadata names (:func:`pbr_core.corpus.held_item_id`), not of its key."""
    documents = list(documents)
    ids = None if ids is None else check_batch(ids, "ids")
    if ids is not None and len(ids) != len(documents):
        raise ValueError(f"{len(ids)} ids for {len(documents)} documents")
    items = []
    for i, doc in enumerate(documents):
        items.append(
            HistoryItem(
                id=id_or_new(ids[i] if ids is not None else _own_id(doc, held)),
                text=doc.page_content,
                metadata={**doc.metadata, user_key: doc.metadata.get(user_key, user_id)},
                timestamp=stored_timestamp(doc.metadata),
            )
        )
    return items


def _own_id(doc: Document, held: bool) -> str | None:
    return held_item_id(doc.id, doc.metadata) if held else doc.id


def documents_of(
    got: Retrieval, mode: str = "dense", explain: ExplainMode = "none"
) -> list[Document]:
    """The found items as the stored documents with the user's own id, plus what
    :attr:`PBRConfig.explain` adds (:func:`~pbr_core.adapters_support.result_metadata`: by
    default nothing, else ``score``, ``store_score``, ``pbr_search`` and ``pbr``, the request's
    :meth:`~pbr_core.retrieval.Retrieval.payload` as LlamaIndex's results carry it)."""
    scored = got.results
    payload = got.payload() if explain in ("first", "all") else {}
    return [
        Document(
            id=s.hit.id,
            page_content=s.hit.text,
            metadata={**s.hit.metadata, **result_metadata(i, s, mode, explain, payload)},
        )
        for i, s in enumerate(scored)
    ]
