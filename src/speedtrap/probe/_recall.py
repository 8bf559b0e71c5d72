"""The recall probe: planted facts in multi-turn chats, a grid of length x depth, Wilson intervals.

By default each (length, depth, sample) gets its own conversation holding one fact: SmolLM2-135M
mixes up several facts told in one conversation even at 256 tokens. With ``shared_prefix`` one
conversation per (length, sample) holds one fact per depth and each question asks for one of them
in its own request, so the questions share the conversation prefix (computed once in-process, and
by a server's prefix cache). Greedy answers are scored by substring match of the planted value.
Samples are written to the results file as they finish; ``resume`` runs only the rest.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from speedtrap._errors import ProbeError, UsageError
from speedtrap.probe._backend import Backend
from speedtrap.probe._conversations import KEYS, Conversation, Fact, build_conversation
from speedtrap.probe._progress import progress_bar
from speedtrap.probe._results import RecallCell, RecallSample
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
        return {**asdict(self), "lengths": list(self.lengths), "depths": list(self.depths)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RecallSettings:
        return cls(
            lengths=tuple(int(n) for n in data["lengths"]),
            depths=tuple(float(d) for d in data["depths"]),
            samples=int(data["samples"]),
            seed=int(data.get("seed", 0)),
            max_new_tokens=int(data.get("max_new_tokens", 24)),
            shared_prefix=bool(data.get("shared_prefix", False)),
        )


@dataclass
class RecallReport:
    backend: str
    settings: RecallSettings
    samples: list[RecallSample]
    cells: list[RecallCell] = field(default_factory=list)
    overall: RecallCell = field(default_factory=lambda: RecallCell.of(0, -1.0, []))
    elapsed_s: float = 0.0

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


async def arun_recall(
    backend: Backend,
    settings: RecallSettings,
    *,
    results_path: Path | None = None,
    resume: bool = False,
    progress: Progress | bool = False,
    known: Sequence[RecallSample] = (),
    on_sample: Callable[[RecallSample], None] | None = None,
) -> RecallReport:
    """The recall probe, async (see :func:`run_recall`). ``known`` samples are not asked again;
    ``on_sample`` sees each new sample as it finishes (a recording appends it)."""
    started = time.perf_counter()
    store = ResultsFile(results_path, "recall", settings.to_json(), resume) if results_path else None
    done = {s.id: s for s in (RecallSample.from_json(r) for r in (store.done if store else []))}
    done.update({s.id: s for s in known})
    todo = [
        (n, i, g)
        for n, i, g in settings.groups()
        if any(f"{settings.conversation_id(n, i, g)}@{d:g}" not in done for d in g)
    ]
    total = len(settings.lengths) * settings.samples * len(settings.depths)
    try:
        with progress_bar(progress, f"recall {backend.name}", total, len(done)) as advance:

            async def ask(conv: Conversation, fact: Fact, counted: int) -> RecallSample:
                answer = await backend.chat(conv.messages(fact), settings.max_new_tokens)
                tokens = answer.prompt_tokens or counted  # a server that reports no usage: the count
                sample = RecallSample(
                    conv.id, conv.length, fact.depth, fact.key, fact.value, answer.text,
                    is_correct(fact.value, answer.text), tokens,
                )  # fmt: skip
                if store:
                    store.append(sample.to_json())
                if on_sample is not None:
                    on_sample(sample)
                advance()
                return sample

            convs = await asyncio.gather(*(_build(backend, settings, n, i, g) for n, i, g in todo))
            for (_, tokens), (n, _, g) in zip(convs, todo, strict=True):
                if tokens > n:
                    raise ProbeError(
                        f"the shortest conversation with {len(g)} fact(s) takes {tokens} tokens, "
                        f"more than the length {n}",
                        "use longer --lengths or fewer --depths",
                    )
            jobs = [ask(conv, f, n) for conv, n in convs for f in conv.facts if f"{conv.id}@{f.depth:g}" not in done]
            fresh = await asyncio.gather(*jobs)
    finally:
        if store:
            store.close()
    return RecallReport(backend.name, settings, [*done.values(), *fresh], elapsed_s=time.perf_counter() - started)


def run_recall(
    backend: Backend,
    settings: RecallSettings,
    *,
    results_path: Path | None = None,
    resume: bool = False,
    progress: Progress | bool = False,
) -> RecallReport:
    """Run the recall probe on ``backend``; finished samples go to ``results_path`` as JSON lines."""
    return asyncio.run(arun_recall(backend, settings, results_path=results_path, resume=resume, progress=progress))
