"""The determinism probe: the same teacher-forced requests sent again, compared position by position.

For each sequence (the divergence probe's conversations, cut to each length) three measurements
of one configuration are taken, one after the other:

1. ``first``: the request alone;
2. ``second``: the identical request again, alone, right after;
3. ``batched``: the identical request once more, in flight together with ``batch`` other requests.

``repeat`` compares first with second, ``batch`` compares second with batched (both repeats, so
the only difference is the company). Both are KL(first || other) per position, as the divergence
probe computes it (exact in-process, top-k over HTTP). They make the stack's **noise floor**.

A finding of its own: **the second identical request differs**, when first vs second diverges
beyond what the batch comparison shows (``kl_max`` more than ``RATIO`` times as large, and not 0):
a cache or graph that takes another path for a repeated request (SGLang #13469, vLLM #43559). Its
positions are then a bug, not noise, and are left out of the floor.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from speedtrap._errors import ProbeError, UsageError
from speedtrap.probe._backend import Backend, Prompt, PromptLogprobs
from speedtrap.probe._divergence import DivergenceSettings, _sequence, compare_dists, exact_positions
from speedtrap.probe._floor import NoiseFloor
from speedtrap.probe._inprocess import InProcessBackend
from speedtrap.probe._progress import progress_bar
from speedtrap.probe._stats import KLStats, PositionStat, summarize

if TYPE_CHECKING:
    pass

RATIO = 4.0  # a repeat diverging this many times more than a batch does is a finding, not noise
SECOND_DIFFERS = "second_request_differs"
BATCH_DIFFERS = "batch_differs"


@dataclass(frozen=True)
class RepeatSettings:
    lengths: tuple[int, ...] = (256, 512)  # sequence lengths in tokens
    sequences: int = 2  # sequences per length
    batch: int = 3  # other requests in flight with the batched copy
    top_k: int = 20  # logprobs asked of a server (HTTP only)
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "lengths", tuple(int(n) for n in self.lengths))
        if not self.lengths or any(n < 64 for n in self.lengths):
            raise UsageError(f"lengths must be at least 64 tokens: {self.lengths}", "pass --lengths like 256,512")
        if self.sequences < 1 or self.top_k < 1 or self.batch < 1:
            raise UsageError("sequences, batch and top_k must be at least 1", "pass positive values")

    @classmethod
    def quick(cls) -> RepeatSettings:
        return cls(lengths=(192,), sequences=1, batch=2)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "lengths": list(self.lengths)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RepeatSettings:
        return cls(**{**data, "lengths": tuple(int(n) for n in data["lengths"])})


@dataclass(frozen=True)
class Finding:
    kind: str  # SECOND_DIFFERS | BATCH_DIFFERS
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Finding:
        return cls(str(data["kind"]), str(data["message"]))


@dataclass
class RepeatReport:
    backend: str
    settings: RepeatSettings
    floor: NoiseFloor
    findings: list[Finding] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def second_differs(self) -> bool:
        return any(f.kind == SECOND_DIFFERS for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        return {
            "probe": "repeat",
            "backend": self.backend,
            "settings": self.settings.to_json(),
            "floor": self.floor.to_json(),
            "findings": [f.to_json() for f in self.findings],
            "elapsed_s": self.elapsed_s,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RepeatReport:
        return cls(
            backend=str(data["backend"]),
            settings=RepeatSettings.from_json(data["settings"]),
            floor=NoiseFloor.from_json(data["floor"]),
            findings=[Finding.from_json(f) for f in data.get("findings", [])],
            elapsed_s=float(data.get("elapsed_s", 0.0)),
        )


# -- measuring ---------------------------------------------------------------------------------


async def _measure(backend: Backend, prompt: Prompt, top_k: int) -> Any:
    """One fresh teacher-forced measurement: full logits in-process (no memo), else the server's top-k."""
    if isinstance(backend, InProcessBackend):
        ids = backend._ids(prompt)
        return backend.engine.prompt_logits(ids, backend.patches)
    return await backend.prompt_logprobs(prompt, top_k)


def _compare(a: Any, b: Any, prompt: Prompt, backend: Backend) -> list[PositionStat]:
    if isinstance(backend, InProcessBackend):
        ids = backend._ids(prompt)
        return exact_positions(a[:-1], b[:-1], ids[1:], 1)
    pa, pb = a, b
    assert isinstance(pa, PromptLogprobs) and isinstance(pb, PromptLogprobs)
    if pa.tokens != pb.tokens:
        raise ProbeError("the server tokenized an identical request differently", "check the server's tokenizer")
    return [
        compare_dists(j, x, y, pa.tokens[j])
        for j, (x, y) in enumerate(zip(pa.positions, pb.positions, strict=True))
        if x is not None and y is not None
    ]


async def _one_sequence(
    backend: Backend, prompt: Prompt, companions: Sequence[Prompt], top_k: int
) -> tuple[list[PositionStat], list[PositionStat]]:
    first = await _measure(backend, prompt, top_k)
    second = await _measure(backend, prompt, top_k)
    batched, *_ = await asyncio.gather(
        _measure(backend, prompt, top_k), *(_measure(backend, c, top_k) for c in companions)
    )
    return _compare(first, second, prompt, backend), _compare(second, batched, prompt, backend)


def findings_of(repeat: KLStats, batch: KLStats) -> list[Finding]:
    out: list[Finding] = []
    if repeat.kl_max > 0 and repeat.kl_max > RATIO * batch.kl_max:
        out.append(
            Finding(
                SECOND_DIFFERS,
                f"the second identical request differs from the first: KL max {repeat.kl_max:.4g}, p99 "
                f"{repeat.kl_p99:.4g}, same top-1 {repeat.same_top1:.3f} over {repeat.tokens} positions, while "
                f"the batched copy differs from the second by at most {batch.kl_max:.4g}: a repeated request takes "
                "another path (a stale cache or a replayed graph?)",
            )
        )
    if batch.kl_max > 0:
        out.append(
            Finding(
                BATCH_DIFFERS,
                f"a request inside a concurrent batch differs from the same request alone: KL p99 {batch.kl_p99:.4g}, "
                f"max {batch.kl_max:.4g}, same top-1 {batch.same_top1:.3f}",
            )
        )
    return out


async def arun_repeat(backend: Backend, settings: RepeatSettings, *, progress: bool = True) -> RepeatReport:
    """The determinism probe, async (see :func:`run_repeat`)."""
    started = time.perf_counter()
    shape = DivergenceSettings(lengths=settings.lengths, sequences=settings.sequences, decode_tokens=1,
                               seed=settings.seed, top_k=settings.top_k)  # fmt: skip
    rep: list[PositionStat] = []
    bat: list[PositionStat] = []
    jobs = [(n, i) for n in settings.lengths for i in range(settings.sequences)]
    with progress_bar(progress, f"repeat {backend.name}", len(jobs), 0) as advance:
        for n, i in jobs:
            prompt = await _sequence(backend, shape, n, i)
            others = [await _sequence(backend, shape, n, settings.sequences + j) for j in range(settings.batch)]
            r, b = await _one_sequence(backend, prompt, others, settings.top_k)
            rep.extend(r)
            bat.extend(b)
            advance()
    repeat, batch = summarize(rep), summarize(bat)
    findings = findings_of(repeat, batch)
    second = any(f.kind == SECOND_DIFFERS for f in findings)
    exact = isinstance(backend, InProcessBackend)
    floor = NoiseFloor(
        overall=batch if second else summarize([*rep, *bat]),
        repeat=repeat,
        batch=batch,
        exact=exact,
        source=backend.name,
        excluded=("repeat",) if second else (),
        note="" if exact else f"top-{settings.top_k} logprobs: KL is a lower bound of the full KL",
    )
    return RepeatReport(backend.name, settings, floor, findings, time.perf_counter() - started)


def run_repeat(backend: Backend, settings: RepeatSettings, *, progress: bool = True) -> RepeatReport:
    """Send each sequence twice alone and once inside a concurrent batch; report the noise floor and findings."""
    return asyncio.run(arun_repeat(backend, settings, progress=progress))
