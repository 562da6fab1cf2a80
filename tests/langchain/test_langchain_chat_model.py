"""LocalGemmaChatModel without loading the model: message flattening and settings."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_tests.unit_tests import ChatModelUnitTests
from pydantic import ValidationError

from langchain_pbr import LocalGemmaChatModel
from langchain_pbr.chat_models import flatten_messages


def test_is_a_langchain_chat_model_asking_for_completion_prompts() -> None:
    llm = LocalGemmaChatModel()
    assert isinstance(llm, BaseChatModel)
    assert llm.prompt_style == "completion"
    assert llm._llm_type == "pbr-local-gemma"


def test_a_single_message_is_the_prompt_verbatim() -> None:
    prompt = "Here are some past messages of a user:\n- kale\n\nThe user asked: x\n1."
    assert flatten_messages([HumanMessage(prompt)]) == prompt


def test_a_conversation_becomes_a_transcript_for_the_assistant_to_continue() -> None:
    text = flatten_messages(
        [SystemMessage("Be brief."), HumanMessage("Hi"), AIMessage("Hello."), HumanMessage("Tea?")]
    )
    assert text == "System: Be brief.\n\nUser: Hi\n\nAssistant: Hello.\n\nUser: Tea?\n\nAssistant:"


def test_model_id_spells_out_the_sampling_settings() -> None:
    llm = LocalGemmaChatModel(max_new_tokens=24, temperature=0.5)
    assert llm.model_id.startswith("gemma-3-270m")
    assert "t=0.5" in llm.model_id and "max=24" in llm.model_id


def test_max_tokens_and_stop_are_the_chat_model_spellings() -> None:
    llm = LocalGemmaChatModel(max_tokens=24, stop=["\n- "])
    assert llm.max_new_tokens == 24
    assert "max=24" in llm.model_id and "stop=" in llm.model_id
    assert LocalGemmaChatModel(max_new_tokens=24).max_new_tokens == 24
    params = llm._get_ls_params()
    assert params["ls_max_tokens"] == 24 and params["ls_stop"] == ["\n- "]


def test_settings_are_validated() -> None:
    with pytest.raises(ValidationError):
        LocalGemmaChatModel(max_new_tokens=0)
    with pytest.raises(ValidationError):
        LocalGemmaChatModel(top_p=1.5)
    with pytest.raises(ValidationError, match="non-empty"):  # was refused at the first call
        LocalGemmaChatModel(stop=[""])


def test_two_models_of_other_stop_strings_are_two_models_to_langchains_cache() -> None:
    """LangChain's LLM cache keys a model by its identifying parameters, which left ``stop``
    out: one model's cached answer was served for the other (from a review)."""
    plain, short = LocalGemmaChatModel(), LocalGemmaChatModel(stop=["\n"])
    assert plain._identifying_params != short._identifying_params


class TestLocalGemmaChatModelStandard(ChatModelUnitTests):
    """LangChain's own unit suite for chat models (it builds the model, never loads weights)."""

    @property
    def chat_model_class(self) -> type[LocalGemmaChatModel]:
        return LocalGemmaChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"temperature": 0.8}  # the suite's default 0 would mean greedy: this one samples
