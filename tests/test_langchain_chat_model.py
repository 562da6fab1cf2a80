"""LocalGemmaChatModel without loading the model: message flattening and settings."""

from __future__ import annotations

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
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


def test_settings_are_validated() -> None:
    with pytest.raises(ValidationError):
        LocalGemmaChatModel(max_new_tokens=0)
    with pytest.raises(ValidationError):
        LocalGemmaChatModel(top_p=1.5)
