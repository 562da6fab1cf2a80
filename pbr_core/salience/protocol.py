"""What a salience scorer must provide, and the prompt layout it scores in (spec §3).

Kept apart from any model so that a scorer of your own needs only this contract: teacher-forced
log-probabilities of a target text after a prompt holding one memory item, in nats (natural log,
<= 0) summed over the target's tokens, with the token count. The template fixes the prompt so
that ``log p(q | c)`` and ``log p(q)`` differ only in the memory slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..errors import NonFiniteLogProbError

__all__ = [
    "DEFAULT_TEMPLATE",
    "LogProbScorer",
    "SalienceTemplate",
    "TokenLogProbs",
]


@dataclass(frozen=True)
class TokenLogProbs:
    """Teacher-forced log-probability of one target text after one prompt.

    Attributes:
        logprob: ``Σ_t log p(target_t | prompt, target_<t)`` in nats (≤ 0).
        num_tokens: how many target tokens the sum runs over.
    """

    logprob: float
    num_tokens: int

    @property
    def mean(self) -> float:
        """Per-token mean log-probability (nats per token)."""
        return self.logprob / self.num_tokens if self.num_tokens else 0.0


@runtime_checkable
class LogProbScorer(Protocol):
    """Scores target texts teacher-forced after a prompt that holds a memory item (no generation).

    ``logprobs(contexts, targets)`` returns, per pair, the summed log-probability of the target's
    tokens and their count. ``contexts[i] == ""`` is the same prompt with an empty memory slot.
    ``conditions`` (optional) is text placed between the memory and the target that is conditioned
    on but not scored; the oracle salience puts the query there and scores the answer.
    ``model_id`` names the model and its settings (it may key a cache).
    """

    model_id: str

    def logprobs(
        self,
        contexts: Sequence[str],
        targets: Sequence[str],
        conditions: Sequence[str] | None = None,
    ) -> list[TokenLogProbs]: ...


@dataclass(frozen=True)
class SalienceTemplate:
    """The prompt layout: ``BOS + memory_block + condition_block + target``.

    ``memory_block`` holds the memory item in ``{memory}``; ``log p(q)`` uses the very same block
    with an empty slot, so the template's own effect on the query cancels in the Bayes factor.
    ``condition_block`` (``{condition}``) is only used when conditions are given (the oracle's
    query before the answer). The target is tokenized on its own, so its tokens are identical in
    every prompt and the conditional and unconditional sums run over the same tokens; blocks
    should therefore end at a natural token boundary (a newline), not in a trailing space.

    The default ``"{memory}\\n"`` makes the empty-slot prompt ``BOS + "\\n"``: a neutral context,
    which the notes (§7) found necessary for SmolLM2, whose BOS is a chat marker.
    """

    memory_block: str = "{memory}\n"
    condition_block: str = "{condition}\n"

    def __post_init__(self) -> None:
        if self.memory_block.count("{memory}") != 1:
            raise ValueError(
                f"memory_block must contain the slot '{{memory}}' exactly once, got "
                f"{self.memory_block!r}"
            )
        if self.condition_block.count("{condition}") != 1:
            raise ValueError(
                f"condition_block must contain the slot '{{condition}}' exactly once, got "
                f"{self.condition_block!r}"
            )

    def memory(self, text: str) -> str:
        """The memory block with ``text`` in the slot (``""`` for the unconditional prompt)."""
        return self.memory_block.replace("{memory}", text)

    def condition(self, text: str) -> str:
        """The condition block with ``text`` in the slot."""
        return self.condition_block.replace("{condition}", text)


DEFAULT_TEMPLATE = SalienceTemplate()


def _non_finite(model_id: str, bad: int, total: int, dtype: str) -> NonFiniteLogProbError:
    return NonFiniteLogProbError(
        f"the language model {model_id!r} ({dtype}) produced NaN/inf log-probabilities for "
        f"{bad} of {total} sequence(s); salience cannot rank with them. Load the model in "
        "float32 (fp16/bf16 can overflow) and check that its weights loaded correctly"
    )
