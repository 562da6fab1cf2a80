"""P-PRF prompts and the lenient parsing of LLM answers (spec §2.2)."""

from __future__ import annotations

import pytest

from pbr_core import CHAT_PROMPTS, COMPLETION_PROMPTS, PromptSet, parse_reasoning, parse_utterances
from pbr_core.prf import build_prompts, format_history

GOOD = ["I want something light after my run today", "Maybe a salad with chickpeas and lemon"]


@pytest.mark.parametrize(
    "answer",
    [
        '{"candidates": ["I want something light after my run today", '
        '"Maybe a salad with chickpeas and lemon"]}',
        '```json\n{"candidates": ["I want something light after my run today", '
        '"Maybe a salad with chickpeas and lemon"]}\n```',
        '{"candidates": ["I want something light after my run today", '
        '"Maybe a salad with chickpeas and lemon",],}',
        'Sure! Here you go:\n{"candidates": ["I want something light after my run today", '
        '"Maybe a salad with chickpeas and lemon"]}\nHope this helps.',
        '["I want something light after my run today", "Maybe a salad with chickpeas and lemon"]',
        "1. I want something light after my run today\n2. Maybe a salad with chickpeas and lemon",
        "- I want something light after my run today\n- Maybe a salad with chickpeas and lemon",
        '{"utterances": [{"text": "I want something light after my run today"}, '
        '{"text": "Maybe a salad with chickpeas and lemon"}]}',
    ],
    ids=[
        "json",
        "fenced",
        "trailing-commas",
        "prose-around",
        "bare-list",
        "numbered",
        "bullets",
        "other-key-objects",
    ],
)
def test_utterances_are_found_in_every_common_shape(answer: str) -> None:
    assert list(parse_utterances(answer).items) == GOOD


def test_more_items_than_asked_are_cut_and_duplicates_dropped() -> None:
    answer = '{"candidates": ["one thing I say", "one thing I say", "ok", "three x", "four x"]}'
    assert parse_utterances(answer, limit=2).items == ("one thing I say", "three x")


def test_fewer_items_than_asked_are_kept() -> None:
    assert parse_utterances('{"candidates": ["only this one"]}', limit=10).items == (
        "only this one",
    )


@pytest.mark.parametrize("answer", ["", "   ", None])
def test_an_empty_answer_yields_nothing_and_a_reason(answer) -> None:
    got = parse_utterances(answer)
    assert got.items == ()
    assert "empty" in (got.problem or "")


def test_prose_without_a_list_is_not_taken_for_utterances() -> None:
    got = parse_utterances("I'm sorry, I can't help with that.")
    assert got.items == ()
    assert got.problem


def test_a_truncated_json_answer_falls_back_to_lines() -> None:
    got = parse_utterances('```json\n{"candidates": [\n"first thing I say",\n"second thing I')
    assert got.items == ("first thing I say", "second thing I")


def test_a_json_list_cut_off_on_one_line_gives_its_strings() -> None:
    """Before: one line that did not parse was prose, so nothing was kept."""
    got = parse_utterances('["I like green tea in the morning", "I run every weekend", "My sis')
    assert got.items == ("I like green tea in the morning", "I run every weekend", "My sis")


def test_prose_before_a_cut_off_json_answer_is_not_an_utterance() -> None:
    answer = (
        "Sure! Here are 10 things this user might say:\n"
        '{"candidates": [\n  "I have been training for the Berlin marathon",\n'
        '  "My sister keeps telling me to try yoga",\n  "I wonder whether I should'
    )
    got = parse_utterances(answer, limit=10)
    assert got.items == (
        "I have been training for the Berlin marathon",
        "My sister keeps telling me to try yoga",
        "I wonder whether I should",
    )


def test_a_numbered_list_prompts_answer_is_not_read_as_json() -> None:
    """A completion prompt asks for a numbered list; JSON-like text there is noise (dates,
    roles), not items, so only a chat answer's cut-off JSON gives its strings."""
    answer = ' {"time": "2024/Oct/26", "role": "user"\n2. I run every weekend'
    assert "user" not in parse_utterances(answer, style="completion").items


def test_a_list_of_objects_gives_each_objects_text_not_its_first_string() -> None:
    answer = (
        '[{"tone": "casual", "line": "I like green tea in the morning"},'
        ' {"tone": "formal", "text": "I run every weekend", "note": "a much longer note here"}]'
    )
    assert parse_utterances(answer).items == (
        "I like green tea in the morning",
        "I run every weekend",
    )


def test_a_json_strings_own_quotes_and_leading_number_are_its_text() -> None:
    answer = '["10 - 15 minutes of yoga keeps me calm", "\\"Casablanca\\" is my favourite film"]'
    assert parse_utterances(answer).items == (
        "10 - 15 minutes of yoga keeps me calm",
        '"Casablanca" is my favourite film',
    )
    # strings the LLM numbered, every one of them: the numbers are markers
    assert parse_utterances('["1. I like tea", "2. I run daily"]').items == (
        "I like tea",
        "I run daily",
    )


def test_a_numbered_list_that_mentions_json_is_read_as_a_list() -> None:
    """Salvaging cut-off JSON once fired on any ``{"`` and dropped the list before it."""
    answer = (
        'Here you go:\n1. I run every weekend\n2. I use {"mode": "dark"} settings on my '
        "phone\n3. My sister likes tea"
    )
    assert parse_utterances(answer).items == (
        "I run every weekend",
        'I use {"mode": "dark"} settings on my phone',
        "My sister likes tea",
    )


def test_a_cut_off_list_of_objects_gives_each_objects_text() -> None:
    answer = (
        '[{"tone": "casual", "line": "I like green tea in the morning"},'
        ' {"tone": "formal", "line": "I run every'
    )
    assert parse_utterances(answer).items == ("I like green tea in the morning", "I run every")
    answer = '{"candidates": [{"text": "a thing I say often"}, {"text": "another thing I sa'
    assert parse_utterances(answer).items == ("a thing I say often", "another thing I sa")


def test_one_json_string_or_ranges_keep_their_leading_numbers() -> None:
    assert parse_utterances('["5 - 10 km runs keep me sane"]').items == (
        "5 - 10 km runs keep me sane",
    )
    assert parse_utterances('["10 - 15 minutes of yoga", "20 - 30 push-ups a day"]').items == (
        "10 - 15 minutes of yoga",
        "20 - 30 push-ups a day",
    )


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        # an object that wraps the list, or an object inside an item, is no item itself
        (
            '{"thoughts": "The user cooks and runs", "queries": ["what can I cook with kale", '
            '"best running shoes for',
            ("what can I cook with kale", "best running shoes for"),
        ),
        (
            '[{"tone": "casual", "meta": {"id": "a1"}, "line": "I like green tea in the morning"},'
            ' {"tone": "formal", "line": "I run every',
            ("I like green tea in the morning", "I run every"),
        ),
        # a key whose value is a number leaves the next list element alone
        ('[{"id": 1}, "I like green tea", "I run every', ("I like green tea", "I run every")),
        # a short preamble on the JSON's own line
        (
            'Sure! {"candidates": ["I could roast beets tonight", "maybe kale chips ag',
            ("I could roast beets tonight", "maybe kale chips ag"),
        ),
        # cut right after a backslash
        (
            '["She said \\"hi\\" to me", "I run every day \\',
            ('She said "hi" to me', "I run every day"),
        ),
    ],
)
def test_a_cut_off_json_answer_gives_the_strings_a_whole_one_would(
    answer: str, expected: tuple[str, ...]
) -> None:
    assert parse_utterances(answer).items == expected


def test_one_string_salvaged_from_text_that_holds_some_json_does_not_replace_its_lines() -> None:
    answer = '{"role":"user", "date":"2024-10-15"} In this message, the user asks.\nShe runs daily.'
    assert parse_utterances(answer).items == (
        '{"role":"user", "date":"2024-10-15"} In this message, the user asks.',
        "She runs daily.",
    )


def test_two_ranges_or_a_list_cut_at_its_next_number_are_read_as_their_strings_say() -> None:
    assert parse_utterances('["1 - 2 cups of coffee a day", "2 - 3 hours of reading"]').items == (
        "1 - 2 cups of coffee a day",
        "2 - 3 hours of reading",
    )
    assert parse_utterances('["1. I like green tea", "2. I run every day", "3.').items == (
        "I like green tea",
        "I run every day",
    )


def test_completion_answers_continue_after_the_first_marker() -> None:
    answer = " what can I cook with kale tonight?\n2. is quinoa better than rice?\n3. more"
    got = parse_utterances(answer, style="completion")
    assert got.items == (
        "what can I cook with kale tonight?",
        "is quinoa better than rice?",
        "more",
    )


def test_reasoning_is_unwrapped_from_fences_and_json() -> None:
    assert parse_reasoning("```\nStep 1: they run.\n```").items == ("Step 1: they run.",)
    assert parse_reasoning('{"reasoning": "Step 1: they run."}').items == ("Step 1: they run.",)
    # every string of a JSON answer, in order, lists included (before: top-level strings only,
    # and a list alone gave the raw JSON text)
    steps = '{"steps": ["They asked about tea.", "They liked green tea."], "answer": "green tea"}'
    assert parse_reasoning(steps).items == (
        "They asked about tea.\nThey liked green tea.\ngreen tea",
    )
    assert parse_reasoning('{"reasoning": ["They run.", "Often."]}').items == ("They run.\nOften.",)
    assert parse_reasoning(" they run a lot", style="completion").items == ("1. they run a lot",)
    assert parse_reasoning("").items == ()
    assert parse_reasoning("```\n```").problem


def test_prompts_carry_history_query_and_count_and_survive_braces() -> None:
    utter, reason = build_prompts(
        CHAT_PROMPTS, "What's for dinner?", ["likes {curly} kale", "runs"], m=7, max_chars=100
    )
    assert "What's for dinner?" in utter and "What's for dinner?" in reason
    assert "- likes {curly} kale\n- runs" in utter
    assert "Write 7 different things" in utter
    assert '{"candidates": ["...", "..."]}' in utter


def test_placeholders_written_in_the_history_or_the_query_stay_text() -> None:
    history = ["{query}" * 100, "see {history} and {m}"]
    utter, reason = build_prompts(CHAT_PROMPTS, "What does {m} mean?", history, m=7, max_chars=800)
    assert "What does {m} mean?" in utter and "What does {m} mean?" in reason
    assert "- see {history} and {m}" in utter
    bound = len(CHAT_PROMPTS.utterances) + len("What does {m} mean?") + 2 * (800 + 3)
    assert len(utter) < bound  # the history's "{query}"s were not each replaced by the query


def test_completion_prompts_end_where_the_list_starts() -> None:
    utter, reason = build_prompts(COMPLETION_PROMPTS, "q?", ["a"], m=5, max_chars=100)
    assert utter.endswith("\n1.") and reason.endswith("\n1.")


def test_long_items_are_cut_to_the_budget() -> None:
    block = format_history(["x" * 500], max_chars=50)
    assert len(block) == len("- ") + 50


def test_a_prompt_without_placeholders_is_rejected() -> None:
    with pytest.raises(ValueError, match="placeholder"):
        PromptSet(utterances="no slots", reasoning="{history} {query}")


def test_the_prompt_style_is_the_override_then_the_llms_own_then_the_fallback() -> None:
    from pbr_core.prf import COMPLETION_PROMPTS, prompts_for_style, resolve_prompt_style

    assert resolve_prompt_style("completion", "chat") == "chat"
    assert resolve_prompt_style("completion") == "completion"
    assert resolve_prompt_style(None) == "chat"
    assert resolve_prompt_style("json-ish", fallback="completion") == "completion"
    assert prompts_for_style("completion") is COMPLETION_PROMPTS
    with pytest.raises(ValueError, match="prompt_style must be one of"):
        resolve_prompt_style(None, "json")


@pytest.mark.parametrize(
    "line",
    ['"candidates":' + " " * 10_000 + "x", "```" + " " * 10_000 + "x", "[" + " " * 10_000 + "x"],
    ids=["key-then-spaces", "fence-then-spaces", "bracket-then-spaces"],
)
def test_a_long_run_of_spaces_in_an_answer_does_not_stall_parsing(line: str) -> None:
    """An LLM answer is untrusted: runs of spaces after a JSON key, a fence or a bracket made
    the parser's patterns backtrack cubically (hours at the 20,000-character cut, outside the
    LLM's timeout and, in async code, on the event loop). A guard of 20 s, not a timing: the
    answer parses in milliseconds now (before, ~15 s at 2,000 spaces)."""
    import signal

    def stalled(*_: object) -> None:
        raise TimeoutError("parsing stalled")

    previous = signal.signal(signal.SIGALRM, stalled)
    signal.alarm(20)
    try:
        parse_reasoning(line)
        parse_utterances(line)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_half_a_surrogate_pair_in_a_json_answer_is_dropped_from_what_is_parsed() -> None:
    """A cut emoji's JSON escape (``"\\ud83d"``) decodes to a lone surrogate, which no UTF-8
    embedder can encode: it is dropped, so the term is embedded (before, the whole request
    raised UnicodeEncodeError)."""
    answer = '{"candidates": ["roasting beets \\ud83d with kale", "kale chips again"]}'
    items = parse_utterances(answer).items
    assert items == ("roasting beets  with kale", "kale chips again")
    reasoning = parse_reasoning('{"reasoning": "she cooks kale \\udc00 often"}').items
    assert reasoning == ("she cooks kale  often",)
    for text in (*items, *reasoning):
        text.encode("utf-8")
