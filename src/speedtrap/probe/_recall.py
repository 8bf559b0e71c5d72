"""The recall probe: planted facts in multi-turn chats, a grid of length x depth, Wilson intervals.

By default each (length, depth, sample) gets its own conversation holding one fact: SmolLM2-135M
mixes up several facts told in one conversation even at 256 tokens. With ``shared_prefix`` one
conversation per (length, sample) holds one fact per depth and each question asks for one of them
in its own request, so the questions share the conversation prefix (computed once in-process, and
by a server's prefix cache). Greedy answers are scored by substring match of the planted value.
Samples are written to the results file as they finish; ``resume`` runs only the rest.

With ``sequential`` and a reference (:class:`RecallReference`, the baseline) the grid is a maximum:
the questions are asked of both in rounds (``round_size`` conversations per length, one batch a
round), and a length stops once its verdict against the reference is decided at ``alpha``/``beta``
(the test and its error-rate argument: :mod:`speedtrap.probe._sequential`). The report says where
each length stopped and why (:class:`~speedtrap.probe._results.LengthStop`).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from speedtrap._errors import ProbeError, UsageError
from speedtrap.probe._backend import Backend
from speedtrap.probe._conversations import KEYS, Conversation, Fact, build_conversation
from speedtrap.probe._progress import progress_bar
from speedtrap.probe._results import LengthStop, RecallCell, RecallSample
from speedtrap.probe._sequential import DEFAULT_ALPHA, DEFAULT_BETA, Sprt, paired_decision
from speedtrap.probe._store import ResultsFile
from speedtrap.progress import Progress


@dataclass(frozen=True)
class RecallSettings:
    lengths: tuple[int, ...] = (256, 512, 1024)  # target prompt lengths in tokens
    depths: tuple[float, ...] = (0.1, 0.5, 0.9)  # where the facts sit: 0 = first turn, 1 = last
    samples: int = 2  # conversations per length (each holds one fact per depth)
    seed: int = 0
    max_new_tokens: int = 24
    shared_prefix: bool = False  # one conversation holds a fact per depth; its questions share the prefix
    sequential: bool = False  # with a reference: ask in rounds, stop a length once its verdict is decided
    alpha: float = DEFAULT_ALPHA  # sequential: the chance of calling a length lost that keeps its facts
    beta: float = DEFAULT_BETA  # sequential: the chance of calling a length kept that loses half of them
    round_size: int = 2  # sequential: conversations per length asked in one round (one batch)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lengths", tuple(int(n) for n in self.lengths))  # lists from TOML or JSON
        object.__setattr__(self, "depths", tuple(float(d) for d in self.depths))
        if not self.lengths or any(n < 64 for n in self.lengths):
            raise UsageError(f"lengths must be at least 64 tokens: {self.lengths}", "pass --lengths like 256,512")
        if not self.depths or any(not 0.0 <= d <= 1.0 for d in self.depths):
            raise UsageError(f"depths must lie in [0, 1]: {self.depths}", "pass --depths like 0.1,0.5,0.9")
        if len(set(self.depths)) != len(self.depths) or len(self.depths) > len(KEYS):
            raise UsageError(f"depths must be distinct and at most {len(KEYS)}", "pass fewer --depths")
        if self.samples < 1 or self.max_new_tokens < 1:
            raise UsageError("samples and max_new_tokens must be at least 1", "pass --samples 1 or more")
        if self.round_size < 1:
            raise UsageError(f"round_size must be at least 1: {self.round_size}", "pass round_size = 2")
        if self.sequential:
            self.test()  # bad error rates fail here

    def test(self) -> Sprt:
        """The sequential test at this probe's error rates."""
        return Sprt(alpha=float(self.alpha), beta=float(self.beta))

    @classmethod
    def quick(cls) -> RecallSettings:
        """A CI-demo preset: 2 lengths x 2 depths x 2 samples = 8 questions."""
        return cls(lengths=(320, 900), depths=(0.2, 0.8), samples=2)

    def groups(self) -> list[tuple[int, int, tuple[float, ...]]]:
        """(length, sample, depths) of every conversation."""
        per = [self.depths] if self.shared_prefix else [(d,) for d in self.depths]
        return [(n, i, g) for n in self.lengths for i in range(self.samples) for g in per]

    def conversation_id(self, length: int, sample: int, depths: tuple[float, ...]) -> str:
        return f"L{length}-s{sample}" if self.shared_prefix else f"L{length}-s{sample}-d{depths[0]:g}"

    def to_json(self) -> dict[str, Any]:
        out = {**asdict(self), "lengths": list(self.lengths), "depths": list(self.depths)}
        if not self.sequential:  # a full grid's settings read as they did before the sequential test
            for key in ("sequential", "alpha", "beta", "round_size"):
                out.pop(key)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RecallSettings:
        return cls(
            lengths=tuple(int(n) for n in data["lengths"]),
            depths=tuple(float(d) for d in data["depths"]),
            samples=int(data["samples"]),
            seed=int(data.get("seed", 0)),
            max_new_tokens=int(data.get("max_new_tokens", 24)),
            shared_prefix=bool(data.get("shared_prefix", False)),
            sequential=bool(data.get("sequential", False)),
            alpha=float(data.get("alpha", DEFAULT_ALPHA)),
            beta=float(data.get("beta", DEFAULT_BETA)),
            round_size=int(data.get("round_size", 2)),
        )


@dataclass
class RecallReport:
    backend: str
    settings: RecallSettings
    samples: list[RecallSample]
    cells: list[RecallCell] = field(default_factory=list)
    overall: RecallCell = field(default_factory=lambda: RecallCell.of(0, -1.0, []))
    elapsed_s: float = 0.0
    stops: list[LengthStop] = field(default_factory=list)  # sequential: where each length stopped

    def __post_init__(self) -> None:
        if not self.cells:
            self.samples.sort(key=lambda s: (s.length, s.conversation, s.depth))
            grid = [(n, d) for n in self.settings.lengths for d in self.settings.depths]
            self.cells = [
                RecallCell.of(n, d, [s for s in self.samples if (s.length, s.depth) == (n, d)]) for n, d in grid
            ]
            self.overall = RecallCell.of(0, -1.0, self.samples)

    def answers(self) -> dict[str, str]:
        """Sample id -> answer: what two runs must agree on to be the same probe."""
        return {s.id: s.answer for s in self.samples}

    def to_json(self) -> dict[str, Any]:
        return {
            "probe": "recall",
            "backend": self.backend,
            "settings": self.settings.to_json(),
            "overall": self.overall.to_json(),
            "cells": [c.to_json() for c in self.cells],
            "samples": [s.to_json() for s in self.samples],
            "elapsed_s": self.elapsed_s,
            **({"stops": [s.to_json() for s in self.stops]} if self.stops else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RecallReport:
        return cls(
            backend=str(data["backend"]),
            settings=RecallSettings.from_json(data["settings"]),
            samples=[RecallSample.from_json(s) for s in data["samples"]],
            cells=[RecallCell.from_json(c) for c in data["cells"]],
            overall=RecallCell.from_json(data["overall"]),
            elapsed_s=float(data.get("elapsed_s", 0.0)),
            stops=[LengthStop.from_json(s) for s in data.get("stops", [])],
        )


_DIGIT_GAPS = re.compile(r"(?<=\d)[ ,.](?=\d)")


def is_correct(expected: str, answer: str) -> bool:
    """Substring match of the planted value (digit groups like "482 913" or "482,913" count)."""
    return expected in answer or expected in _DIGIT_GAPS.sub("", answer)


def conversation_seed(seed: int, length: int, sample: int) -> int:
    return (seed * 1_000_003 + length) * 1_009 + sample


async def _build(
    backend: Backend, settings: RecallSettings, length: int, sample: int, depths: tuple[float, ...]
) -> tuple[Conversation, int]:
    # a single-fact conversation depends on its depth's value, so a grid's subset has the same conversations
    variant = sample if settings.shared_prefix else sample * 10_000 + round(depths[0] * 1_000) + 1
    seed = conversation_seed(settings.seed, length, variant)
    conv_id = settings.conversation_id(length, sample, depths)
    return await build_conversation(conv_id, length, depths, seed, backend.count_tokens)


class RecallReference:
    """The reference of a sequential recall probe (the baseline): its backend and the answers it has
    given so far. Each candidate asked against it asks it only the questions it lacks, so the
    candidates of one run share its answers, and :meth:`report` is what it was asked. Without a backend
    (a server's baseline, stopped before the candidate's server starts: one stack alive) the known answers
    must hold every question asked; one missing is an error, never a wrong answer."""

    def __init__(self, backend: Backend | None, known: Sequence[RecallSample] = ()) -> None:
        self.backend = backend  # None: the known answers only (a server's baseline, measured before the trial)
        self.samples: dict[str, RecallSample] = {s.id: s for s in known}

    def report(self, settings: RecallSettings) -> RecallReport:
        return RecallReport(self.backend.name if self.backend else "baseline", settings, list(self.samples.values()))


async def _ask(
    backend: Backend, settings: RecallSettings, conv: Conversation, fact: Fact, counted: int
) -> RecallSample:
    answer = await backend.chat(conv.messages(fact), settings.max_new_tokens)
    tokens = answer.prompt_tokens or counted  # a server that reports no usage: the count
    return RecallSample(
        conv.id, conv.length, fact.depth, fact.key, fact.value, answer.text,
        is_correct(fact.value, answer.text), tokens,
    )  # fmt: skip


async def _conversations(
    backend: Backend, settings: RecallSettings, todo: Sequence[tuple[int, int, tuple[float, ...]]]
) -> list[tuple[Conversation, int]]:
    convs = await asyncio.gather(*(_build(backend, settings, n, i, g) for n, i, g in todo))
    for (_, tokens), (n, _, g) in zip(convs, todo, strict=True):
        if tokens > n:
            raise ProbeError(
                f"the shortest conversation with {len(g)} fact(s) takes {tokens} tokens, more than the length {n}",
                "use longer --lengths or fewer --depths",
            )
    return [(conv, n) for (conv, _), (n, _, _) in zip(convs, todo, strict=True)]


async def _sequential(
    backend: Backend,
    settings: RecallSettings,
    reference: RecallReference,
    done: dict[str, RecallSample],
    ask: Callable[[Conversation, Fact, int], Awaitable[tuple[str, RecallSample]]],
) -> list[LengthStop]:
    """Ask in rounds until every length is decided or its grid is spent; ``done`` gains the answers."""
    test = settings.test()
    groups = settings.groups()
    order = {n: [g for g in groups if g[0] == n] for n in settings.lengths}
    asked = dict.fromkeys(settings.lengths, 0)
    decided: dict[int, str] = {}

    async def ask_reference(conv: Conversation, fact: Fact, counted: int) -> tuple[str, RecallSample]:
        if reference.backend is None:
            raise ProbeError(
                f"the reference holds no answer to {conv.id}@{fact.depth:g} and has no server to ask",
                "measure the baseline's whole grid with the same recall settings first",
            )
        return "reference", await _ask(reference.backend, settings, conv, fact, counted)

    while True:
        todo = []
        for n in settings.lengths:
            if n in decided:
                continue
            chunk = order[n][asked[n] : asked[n] + settings.round_size]
            if not chunk:
                decided[n] = "undecided"
                continue
            asked[n] += len(chunk)
            todo += chunk
        if not todo:
            break
        jobs: list[Any] = []
        for conv, n in await _conversations(backend, settings, todo):
            for fact in conv.facts:
                sid = f"{conv.id}@{fact.depth:g}"
                if sid not in done:
                    jobs.append(ask(conv, fact, n))
                if sid not in reference.samples:
                    jobs.append(ask_reference(conv, fact, n))
        for who, sample in await asyncio.gather(*jobs):
            (done if who == "candidate" else reference.samples)[sample.id] = sample
        for n in settings.lengths:
            if n in decided:
                continue
            ids = [f"{settings.conversation_id(m, i, g)}@{d:g}" for m, i, g in order[n][: asked[n]] for d in g]
            decision = paired_decision(test, [(reference.samples[i].correct, done[i].correct) for i in ids])
            if decision is not None:
                decided[n] = decision
    stops = []
    for n in settings.lengths:
        ids = [f"{settings.conversation_id(m, i, g)}@{d:g}" for m, i, g in order[n][: asked[n]] for d in g]
        stops.append(
            LengthStop(
                n, decided[n], len(ids), len(order[n]) * len(order[n][0][2]) if order[n] else 0,
                sum(done[i].correct for i in ids), sum(reference.samples[i].correct for i in ids),
                float(settings.alpha), float(settings.beta),
            )
        )  # fmt: skip
    return stops


async def arun_recall(
    backend: Backend,
    settings: RecallSettings,
    *,
    results_path: Path | None = None,
    resume: bool = False,
    progress: Progress | bool = False,
    known: Sequence[RecallSample] = (),
    on_sample: Callable[[RecallSample], None] | None = None,
    reference: RecallReference | None = None,
) -> RecallReport:
    """The recall probe, async (see :func:`run_recall`). ``known`` samples are not asked again;
    ``on_sample`` sees each new sample as it finishes (a recording appends it). With
    ``settings.sequential`` and a ``reference`` the questions go in rounds against the reference's
    (the reference asked only what it lacks) and each length stops once decided."""
    started = time.perf_counter()
    store = ResultsFile(results_path, "recall", settings.to_json(), resume) if results_path else None
    done = {s.id: s for s in (RecallSample.from_json(r) for r in (store.done if store else []))}
    done.update({s.id: s for s in known})
    before = dict(done)
    total = len(settings.lengths) * settings.samples * len(settings.depths)
    stops: list[LengthStop] = []
    try:
        with progress_bar(progress, f"recall {backend.name}", total, len(done)) as advance:

            async def ask(conv: Conversation, fact: Fact, counted: int) -> tuple[str, RecallSample]:
                sample = await _ask(backend, settings, conv, fact, counted)
                if store:
                    store.append(sample.to_json())
                if on_sample is not None:
                    on_sample(sample)
                advance()
                return "candidate", sample

            if settings.sequential and reference is not None:
                stops = await _sequential(backend, settings, reference, done, ask)
            else:
                todo = [
                    (n, i, g)
                    for n, i, g in settings.groups()
                    if any(f"{settings.conversation_id(n, i, g)}@{d:g}" not in done for d in g)
                ]
                jobs = [
                    ask(conv, f, n)
                    for conv, n in await _conversations(backend, settings, todo)
                    for f in conv.facts
                    if f"{conv.id}@{f.depth:g}" not in done
                ]
                for _, sample in await asyncio.gather(*jobs):
                    done[sample.id] = sample
    finally:
        if store:
            store.close()
    fresh = [s for k, s in done.items() if k not in before]
    return RecallReport(
        backend.name, settings, [*before.values(), *fresh], elapsed_s=time.perf_counter() - started, stops=stops
    )


def run_recall(
    backend: Backend,
    settings: RecallSettings,
    *,
    results_path: Path | None = None,
    resume: bool = False,
    progress: Progress | bool = False,
    reference: RecallReference | None = None,
) -> RecallReport:
    """Run the recall probe on ``backend``; finished samples go to ``results_path`` as JSON lines.
    With ``settings.sequential`` and a ``reference``: in rounds, each length until decided."""
    coro = arun_recall(
        backend, settings, results_path=results_path, resume=resume, progress=progress, reference=reference
    )
    return asyncio.run(coro)
