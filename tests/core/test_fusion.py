"""Fusion (spec §2.4) and its ablations (spec §2.5) on a hand-computed 2-D case."""

from __future__ import annotations

import numpy as np
import pytest

from pbr_core import FUSION_MODES, fuse

Q = np.array([1.0, 0.0])
ANCHOR = np.array([0.0, 1.0])
F_AVG = np.array([0.6, 0.8])
R = np.array([0.0, -1.0])
# mid = (q + anchor)/2 = (0.5, 0.5); cos(mid, f) = (0.3 + 0.4)/(0.7071·1) = 0.98995;
# cos(mid, r) = -0.5/0.7071 = -0.70711
W1 = 1 + 0.7 / np.sqrt(0.5)
W2 = 1 - 0.5 / np.sqrt(0.5)


def test_full_fusion_by_hand() -> None:
    got = fuse(Q, anchor=ANCHOR, f_avg=F_AVG, r=R, mode="full")
    assert got.w1 == pytest.approx(W1)
    assert got.w2 == pytest.approx(W2)
    np.testing.assert_allclose(got.vector, Q + ANCHOR + W1 * F_AVG + W2 * R, rtol=1e-6)
    assert got.used == ("query", "anchor", "utterances", "reasoning")


def test_weights_lie_in_zero_to_two() -> None:
    got = fuse(Q, anchor=ANCHOR, f_avg=-Q - ANCHOR, r=Q + ANCHOR, mode="full")
    assert got.w1 == pytest.approx(0.0)
    assert got.w2 == pytest.approx(2.0)


def test_without_anchor_the_midpoint_is_the_query() -> None:
    got = fuse(Q, anchor=ANCHOR, f_avg=F_AVG, r=R, mode="no_anchor")
    assert got.w1 == pytest.approx(1 + 0.6)
    assert got.w2 == pytest.approx(1 + 0.0)
    np.testing.assert_allclose(got.vector, Q + 1.6 * F_AVG + 1.0 * R, rtol=1e-6)


def test_without_prf_it_is_query_plus_anchor() -> None:
    got = fuse(Q, anchor=ANCHOR, f_avg=F_AVG, r=R, mode="no_prf")
    np.testing.assert_allclose(got.vector, Q + ANCHOR)
    assert got.w1 is None and got.w2 is None


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("no_utterances", Q + ANCHOR + W2 * R),
        ("no_reasoning", Q + ANCHOR + W1 * F_AVG),
        ("plain", Q),
    ],
)
def test_dropping_one_term(mode, expected) -> None:
    np.testing.assert_allclose(
        fuse(Q, anchor=ANCHOR, f_avg=F_AVG, r=R, mode=mode).vector, expected, rtol=1e-6
    )


def test_a_missing_term_is_left_out_and_the_mid_follows() -> None:
    got = fuse(Q, anchor=None, f_avg=F_AVG, r=None, mode="full")
    assert got.used == ("query", "utterances")
    assert got.w1 == pytest.approx(1.6)
    np.testing.assert_allclose(got.vector, Q + 1.6 * F_AVG, rtol=1e-6)


#: What each mode's name says it uses (the paper's ablations), written out rather than read
#: from the table under test.
NAMED_TERMS = {
    "full": ("anchor", "utterances", "reasoning"),
    "paper": ("anchor", "utterances", "reasoning"),
    "no_anchor": ("utterances", "reasoning"),
    "no_prf": ("anchor",),
    "no_utterances": ("anchor", "reasoning"),
    "no_reasoning": ("anchor", "utterances"),
    "plain": (),
}


def test_every_mode_uses_the_query_and_exactly_the_terms_its_name_says() -> None:
    assert set(NAMED_TERMS) | {"safe"} == set(FUSION_MODES)
    for mode, terms in NAMED_TERMS.items():
        assert fuse(Q, anchor=ANCHOR, f_avg=F_AVG, r=R, mode=mode).used == ("query", *terms)
    # safe: trust decides which terms stay, the query always does
    assert fuse(Q, anchor=ANCHOR, f_avg=F_AVG, r=R, mode="safe").used[0] == "query"


PAPER = Q + ANCHOR + W1 * F_AVG + W2 * R


def test_safe_fusion_applies_the_papers_full_shift_when_every_term_is_trusted() -> None:
    # cos(q, f) = 0.6 and cos(q, r) = 0.0: a ramp -0.1 -> 0.0 trusts both fully.
    got = fuse(Q, anchor=ANCHOR, f_avg=F_AVG, r=R, mode="safe", trust_low=-0.1, trust_high=0.0)
    assert got.trust == pytest.approx(
        {"utterances": 1.0, "reasoning": 1.0, "closest_feedback": 0.6, "shift": 1.0}
    )
    assert got.fallback is None
    assert got.used == ("query", "anchor", "utterances", "reasoning")
    np.testing.assert_allclose(got.vector, PAPER, rtol=1e-6)


def test_safe_fusion_shift_is_the_minimum_plus_the_mean_trust() -> None:
    # ramp 0.3 -> 0.45: f is trusted (0.6 >= 0.45), r is not (0.0 <= 0.3); mean trust 0.5.
    got = fuse(
        Q,
        anchor=ANCHOR,
        f_avg=F_AVG,
        r=R,
        mode="safe",
        trust_low=0.3,
        trust_high=0.45,
        safe_min_shift=0.2,
    )
    shift = 0.2 + 0.8 * 0.5
    assert got.trust == pytest.approx(
        {"utterances": 1.0, "reasoning": 0.0, "closest_feedback": 0.6, "shift": shift}
    )
    np.testing.assert_allclose(got.vector, Q + shift * (PAPER - Q), rtol=1e-6)
    assert got.w1 == pytest.approx(shift * W1) and got.w2 == pytest.approx(shift * W2)


def test_safe_fusion_ramps_trust_between_the_thresholds() -> None:
    got = fuse(
        Q,
        anchor=ANCHOR,
        f_avg=F_AVG,
        r=None,
        mode="safe",
        trust_low=0.5,
        trust_high=0.7,
        safe_min_shift=0.25,
    )
    t = (0.6 - 0.5) / (0.7 - 0.5)
    assert got.trust["utterances"] == pytest.approx(t)
    shift = 0.25 + 0.75 * t
    paper = Q + ANCHOR + (1 + 0.7 / np.sqrt(0.5)) * F_AVG
    np.testing.assert_allclose(got.vector, Q + shift * (paper - Q), rtol=1e-6)


def test_safe_fusion_falls_back_to_the_plain_query_without_on_topic_feedback() -> None:
    away = fuse(Q, anchor=ANCHOR, f_avg=-F_AVG, r=R, mode="safe")  # cosines -0.6 and 0.0
    assert away.used == ("query",) and away.trust["shift"] == 0.0
    np.testing.assert_allclose(away.vector, Q)
    assert away.fallback is not None and "no usable pseudo feedback" in away.fallback
    anchor_only = fuse(Q, anchor=ANCHOR, mode="safe")  # never the anchor alone
    assert anchor_only.used == ("query",)
    np.testing.assert_allclose(anchor_only.vector, Q)


def test_safe_fusion_keeps_the_plain_query_when_a_history_item_beats_the_feedback() -> None:
    # The closest feedback term is f (cos 0.6 with q): a history item at cos 0.7 means the query
    # already matches this user's history better than the pseudo feedback does.
    ramp = {"trust_low": -0.1, "trust_high": 0.0}  # both terms fully trusted
    gated = fuse(Q, anchor=ANCHOR, f_avg=F_AVG, r=R, mode="safe", best_history_cos=0.7, **ramp)
    np.testing.assert_allclose(gated.vector, Q)
    assert gated.used == ("query",) and gated.w1 is None and gated.w2 is None
    assert gated.trust["shift"] == 0.0 and gated.trust["closest_history"] == 0.7
    assert gated.fallback is not None and "0.70" in gated.fallback and "0.60" in gated.fallback

    below = fuse(Q, anchor=ANCHOR, f_avg=F_AVG, r=R, mode="safe", best_history_cos=0.5, **ramp)
    np.testing.assert_allclose(below.vector, PAPER, rtol=1e-6)
    off = fuse(
        Q, anchor=ANCHOR, f_avg=F_AVG, r=R, mode="safe", best_history_cos=0.7,
        history_gate=False, **ramp,
    )  # fmt: skip
    np.testing.assert_allclose(off.vector, PAPER, rtol=1e-6)
    # the paper's fusion has no gate
    paper = fuse(Q, anchor=ANCHOR, f_avg=F_AVG, r=R, mode="paper", best_history_cos=0.99)
    np.testing.assert_allclose(paper.vector, PAPER, rtol=1e-6)


def test_every_fusion_mode_says_which_terms_it_uses() -> None:
    from pbr_core.config import FUSION_MODES
    from pbr_core.fusion import MODE_TERMS

    assert tuple(MODE_TERMS) == FUSION_MODES  # one list of modes, the FusionMode type's
    assert MODE_TERMS["paper"] == MODE_TERMS["full"]  # "paper" is the name for "full"


def test_safe_fusions_trust_ramp_needs_its_low_bound_below_its_high_one() -> None:
    """Direct callers of ``fuse`` / ``trust`` (a custom fusion rule) get the rule PBRConfig
    applies (before: a ZeroDivisionError for equal bounds, an inverted ramp for reversed)."""
    import pytest

    from pbr_core.fusion import trust

    q, f = np.array([1.0, 0.0]), np.array([0.8, 0.6])
    for low, high in ((0.6, 0.6), (0.9, 0.3)):
        with pytest.raises(ValueError, match="trust_low must be below trust_high"):
            trust(q, f, low, high)
    assert trust(q, f, 0.3, 0.9) == pytest.approx(0.8333333)
