"""Sequential verdicts: ask in rounds and stop a configuration once its verdict against the reference is decided.

The recall probe asks the same questions of the reference (the baseline) and of a candidate, a round
(one batch) at a time, length by length. Each question the reference answers right is a trial for
the candidate: a *loss* when the candidate answers it wrong, a *keep* when it answers it right
(questions the reference gets wrong say nothing about what the candidate lost, and are skipped).
Let ``q`` be the share of the reference's facts the candidate loses at that length. The test is
Wald's sequential probability ratio test of

- H0 ``q <= q0`` (the candidate *keeps* its facts: ``q0 = 1 - KEEP_RATIO``, the full grid's rule that
  a length keeps its facts at 85% of the reference's accuracy), against
- H1 ``q >= q1`` (the candidate *loses* them: ``q1 = 0.5``, half the facts or more),

on the log likelihood ratio ``L_n = losses * log(q1/q0) + keeps * log((1-q1)/(1-q0))``, with the
anytime-valid boundaries of Ville's inequality rather than Wald's approximations:

- stop *lost* when ``L_n >= log(1/alpha)``;
- stop *kept* when ``L_n <= log(beta)``.

Error rates. Under ``q = q0`` the likelihood ratio ``exp(L_n)`` is a non-negative martingale of mean 1,
so by Ville's inequality ``P(sup_n exp(L_n) >= 1/alpha) <= alpha``: the chance of ever stopping *lost*
when the candidate keeps its facts is at most ``alpha``, however many rounds are asked and wherever the
grid truncates the test (truncation only removes stops). For ``q < q0`` the ratio is a
supermartingale (the likelihood ratio is monotone in ``q``), so the bound holds on all of H0.
Symmetrically ``exp(-L_n)`` is a martingale under ``q = q1`` and a supermartingale for ``q > q1``:
the chance of ever stopping *kept* when the candidate loses half its facts or more is at most
``beta``. Between ``q0`` and ``q1`` neither error is defined; the test may stop either way or not at
all. These are the rates of the test alone; each stop also needs the full grid's own reading of
the asked samples to agree (a *lost* stop needs the Wilson 95% intervals apart, a *kept* stop needs
them overlapping and the accuracy at least ``KEEP_RATIO`` of the reference's), which only removes
stops, so the rates stay bounded, and what the report then says of the asked samples is the
verdict the test reached. A length the test has not decided when its grid runs out is *undecided*:
the grid was the maximum, and the full grid's reading of it is the verdict, as before.

``tests/probe/test_sequential.py`` checks both rates by simulation (Bernoulli draws at ``q0`` and
``q1``, with and without truncation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from speedtrap._errors import UsageError
from speedtrap._stats import wilson

KEEP_RATIO = 0.85  # a length keeps its facts at this share of the reference's accuracy (the full grid's rule)
LOSS_H1 = 0.5  # the loss share the test must catch with probability 1 - beta
DEFAULT_ALPHA = 0.05  # TensorRT-LLM's accuracy tests' error rates
DEFAULT_BETA = 0.2

Decision = Literal["lost", "kept"]


@dataclass(frozen=True)
class Sprt:
    """The loss test's error rates and hypotheses (see the module's docstring)."""

    alpha: float = DEFAULT_ALPHA  # the chance of stopping "lost" when the candidate keeps its facts
    beta: float = DEFAULT_BETA  # the chance of stopping "kept" when it loses half of them or more
    q0: float = 1.0 - KEEP_RATIO
    q1: float = LOSS_H1

    def __post_init__(self) -> None:
        for name, value in (("alpha", self.alpha), ("beta", self.beta)):
            if not 0.0 < value < 0.5:
                raise UsageError(f"{name} must lie in (0, 0.5): {value}", f"pass {name} like 0.05")
        if not 0.0 < self.q0 < self.q1 < 1.0:
            raise UsageError(f"the loss shares must satisfy 0 < q0 < q1 < 1: {self.q0}, {self.q1}", "keep the defaults")

    def llr(self, losses: int, keeps: int) -> float:
        """The log likelihood ratio of H1 against H0 after ``losses`` and ``keeps``."""
        return losses * math.log(self.q1 / self.q0) + keeps * math.log((1 - self.q1) / (1 - self.q0))

    def decide(self, losses: int, keeps: int) -> Decision | None:
        """ "lost" or "kept" once a boundary is crossed, else None (ask on)."""
        value = self.llr(losses, keeps)
        if value >= math.log(1 / self.alpha):
            return "lost"
        if value <= math.log(self.beta):
            return "kept"
        return None


def length_reading(ref_correct: int, ref_n: int, correct: int, n: int) -> Decision | None:
    """The full grid's reading of one length: "lost" when the Wilson intervals are apart (the run's
    below), "kept" when they overlap and the accuracy is at least KEEP_RATIO of the reference's."""
    if not n or not ref_n:
        return None
    low, high = wilson(correct, n)
    ref_low, ref_high = wilson(ref_correct, ref_n)
    if high < ref_low:
        return "lost"
    if high >= ref_low and low <= ref_high and correct / n >= KEEP_RATIO * (ref_correct / ref_n):
        return "kept"
    return None


def paired_decision(test: Sprt, pairs: list[tuple[bool, bool]]) -> Decision | None:
    """The sequential verdict on (reference right, candidate right) pairs: the test's stop, confirmed
    by the full grid's reading of the same pairs (None: ask on)."""
    losses = sum(1 for ref, cand in pairs if ref and not cand)
    keeps = sum(1 for ref, cand in pairs if ref and cand)
    stop = test.decide(losses, keeps)
    if stop is None:
        return None
    reading = length_reading(sum(r for r, _ in pairs), len(pairs), sum(c for _, c in pairs), len(pairs))
    return stop if reading == stop else None
