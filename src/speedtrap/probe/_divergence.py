"""The divergence probe: baseline vs candidate next-token distributions on the same token sequences.

Like llama.cpp's ``--kl-divergence``: KL(baseline || candidate) mean, median, p90, p99 and max,
same-top-1 rate and RMS change of the correct token's probability, overall and by position
bucket, for two phases: prefill (one forward over the sequence) and decode (a prefix prefilled,
the tail fed one token at a time through the KV cache). In-process backends compare full
distributions exactly; anything else compares the top-k logprobs a server returns (see
:data:`APPROXIMATION`).
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speedtrap._errors import ProbeError, UsageError
from speedtrap.probe._backend import Backend, Prompt, PromptLogprobs, TokenDist
from speedtrap.probe._conversations import build_conversation
from speedtrap.probe._divergence_stop import DivergenceGoal, stop_sentence
from speedtrap.probe._inprocess import InProcessBackend
from speedtrap.probe._keys import KeyTally, check_keys, check_same_tokenizer, dists_by_ids, mapper_of, prompt_by_ids
from speedtrap.probe._progress import progress_bar
from speedtrap.probe._recall import conversation_seed
from speedtrap.probe._results import PhaseDivergence, flatten_figures
from speedtrap.probe._stats import PositionStat
from speedtrap.probe._store import ResultsFile
from speedtrap.progress import Progress
from speedtrap.spec import WORST_STATS, metric

if TYPE_CHECKING:
    from torch import Tensor

PHASES = ("prefill", "decode")
APPROXIMATION = (
    "top-{k} logprobs from the server: KL over the baseline's top-{k} tokens plus one bucket for the rest of the "
    "vocabulary (a lower bound of the full KL), a token missing from the candidate's top-{k} taken at the "
    "candidate's k-th logprob; decode steps are greedy continuations compared up to the first step where the two "
    "choose different tokens, with the baseline's choice as the correct token"
)
APPROXIMATION_K = (
    "top-k logprobs, different on each side (baseline top-{kb}, candidate top-{kc}): KL over the baseline's "
    "top-{kb} tokens plus one bucket for the rest of the vocabulary (a lower bound of the full KL), a token "
    "missing from the candidate's top-{kc} taken at the candidate's k-th logprob; same-top-1 compares each side's "
    "argmax; decode steps are greedy continuations compared up to the first step where the two choose different "
    "tokens, with the baseline's choice as the correct token"
)
KEYING = "tokens keyed by id; text names mapped to ids with the target's tokenizer"
LOGPROB_FLOOR = -100.0  # a -inf (null) logprob of the candidate, where the baseline's is finite: KL stays finite


@dataclass(frozen=True)
class DivergenceSettings:
    lengths: tuple[int, ...] = (512, 1024)  # sequence lengths in tokens
    sequences: int = 1  # sequences per length
    decode_tokens: int = 32  # tokens at the end fed one by one in the decode pass
    bucket_size: int = 128  # position buckets of the report
    seed: int = 0
    top_k: int = 20  # logprobs asked of a server (HTTP only)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lengths", tuple(int(n) for n in self.lengths))  # lists from TOML or JSON
        if not self.lengths or any(n < 64 for n in self.lengths):
            raise UsageError(f"lengths must be at least 64 tokens: {self.lengths}", "pass --lengths like 512,1024")
        if self.sequences < 1 or self.bucket_size < 1 or self.top_k < 1:
            raise UsageError("sequences, bucket_size and top_k must be at least 1", "pass positive values")
        if not 1 <= self.decode_tokens < min(self.lengths) // 2:
            raise UsageError(
                f"decode_tokens must be in 1..{min(self.lengths) // 2 - 1}", "pass a smaller --decode-tokens"
            )

    @classmethod
    def quick(cls) -> DivergenceSettings:
        return cls(lengths=(384,), sequences=1, decode_tokens=16, bucket_size=128)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "lengths": list(self.lengths)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DivergenceSettings:
        return cls(**{**data, "lengths": tuple(int(n) for n in data["lengths"])})


@dataclass(frozen=True)
class Departure:
    """Where one sequence's decode first leaves the baseline: the decode step (0: the token the prefill's forward
    predicts; 1: the first computed from the KV cache) whose argmax differs, and the KL there."""

    step: int
    kl: float

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "kl": self.kl}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Departure:
        return cls(int(data["step"]), float(data["kl"]))

    @classmethod
    def of(cls, decode: Sequence[PositionStat]) -> Departure | None:
        """The first decode step whose argmax differs (``decode``: one sequence's steps, in order)."""
        first = decode[0].position if decode else 0
        return next((cls(s.position - first, s.kl) for s in decode if not s.same_top1), None)


def decode_side_reading(phases: Mapping[str, PhaseDivergence], departures: Sequence[Departure | None]) -> str | None:
    """A sentence when the figures point at the decode side, else None; said only where it was measured.

    - Every prefill position has the baseline's argmax, every sequence's decode leaves the baseline at step 1
      (the first token computed from the KV cache; step 0, the prefill forward's own token, agrees), and the KL
      there exceeds the largest KL of any prefill position: the decode is wrong from its first KV read. On a
      prefill/decode-disaggregated stack, what a decode shows that did not receive the prefill's KV.
    - Otherwise, every prefill position is bit-identical to the baseline (KL 0) and some sequence's decode leaves
      it: the prompt's computation is unchanged, so the difference is on the decode side.
    """
    prefill = phases.get("prefill")
    left = [d for d in departures if d is not None]
    if prefill is None or prefill.overall.tokens == 0 or prefill.overall.same_top1 < 1.0 or not left:
        return None
    largest = prefill.overall.kl_max
    kls = sorted(d.kl for d in left)
    kl = f"KL {kls[0]:.3g}" if len(kls) == 1 else f"KL {kls[0]:.3g}-{kls[-1]:.3g}"
    if len(left) == len(departures) and all(d.step == 1 and d.kl > largest for d in left):
        return (
            f"the decode is wrong from its first token read from the KV cache (decode step 1 in {len(left)} of "
            f"{len(departures)} sequence(s), {kl}) while every prefill position agrees (largest KL {largest:.3g}): "
            "the fault is on the decode side, in the KV the decode reads or in its own computation; on a "
            "prefill/decode-disaggregated stack, a decode that did not receive the prefill's KV"
        )
    if largest == 0.0:
        steps = sorted({d.step for d in left})
        at = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
        return (
            f"every prefill position is bit-identical to the baseline (KL 0) and the decode leaves it at {at} "
            f"({len(left)} of {len(departures)} sequence(s), {kl}): the fault is on the decode side, in the KV cache "
            "it reads or in its own computation"
        )
    return None


@dataclass
class DivergenceReport:
    baseline: str
    candidate: str
    settings: DivergenceSettings
    phases: dict[str, PhaseDivergence]
    approximation: str | None = None  # None: exact full-vocabulary distributions
    elapsed_s: float = 0.0
    sequence_tokens: list[int] = field(default_factory=list)
    engines: dict[str, str] = field(default_factory=dict)  # "baseline"/"candidate" -> engine and version
    top_k_seen: dict[str, int] = field(default_factory=dict)  # the k each side returned (HTTP only)
    keys: dict[str, Any] = field(default_factory=dict)  # text names mapped to ids, and those that were not
    departures: list[Departure | None] = field(default_factory=list)  # per sequence, in job order
    goal: DivergenceGoal | None = None  # the verdict the probe could stop on (None: the full grid, always)
    stopped: str | None = None  # where the probe stopped early and why (None: the whole grid was measured)
    unmeasured: list[str] = field(default_factory=list)  # phases not measured (stopped before them): not in phases

    def reading(self) -> str | None:
        """What the figures say of where the fault is (:func:`decode_side_reading`), or None."""
        return decode_side_reading(self.phases, self.departures)

    def to_json(self) -> dict[str, Any]:
        return {
            "probe": "divergence",
            "baseline": self.baseline,
            "candidate": self.candidate,
            "settings": self.settings.to_json(),
            "phases": {k: v.to_json() for k, v in self.phases.items()},
            "worst": {k.removeprefix("worst."): v for k, v in self.figures().items() if k.startswith("worst.")},
            "approximation": self.approximation,
            "elapsed_s": self.elapsed_s,
            "sequence_tokens": self.sequence_tokens,
            "engines": self.engines,
            "top_k_seen": self.top_k_seen,
            "keys": self.keys,
            "departures": [None if d is None else d.to_json() for d in self.departures],
            "reading": self.reading(),
            **({"goal": self.goal.to_json()} if self.goal is not None else {}),
            **({"stopped": self.stopped, "unmeasured": self.unmeasured} if self.stopped is not None else {}),
        }

    def figures(self) -> dict[str, float]:
        """The figures a verdict reads (:func:`divergence_figures`)."""
        return divergence_figures(self.phases)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DivergenceReport:
        return cls(
            baseline=str(data["baseline"]),
            candidate=str(data["candidate"]),
            settings=DivergenceSettings.from_json(data["settings"]),
            phases={k: PhaseDivergence.from_json(v) for k, v in data["phases"].items()},
            approximation=data.get("approximation"),
            elapsed_s=float(data.get("elapsed_s", 0.0)),
            sequence_tokens=[int(n) for n in data.get("sequence_tokens", [])],
            engines={str(k): str(v) for k, v in data.get("engines", {}).items()},
            top_k_seen={str(k): int(v) for k, v in data.get("top_k_seen", {}).items()},
            keys=dict(data.get("keys", {})),
            departures=[None if d is None else Departure.from_json(d) for d in data.get("departures", [])],
            goal=DivergenceGoal(**data["goal"]) if data.get("goal") else None,
            stopped=data.get("stopped"),
            unmeasured=[str(p) for p in data.get("unmeasured", [])],
        )

    def figures_note(self) -> str | None:
        """What a reader must know of the figures of a stopped report, or None."""
        if self.stopped is None:
            return None
        return (
            f"stopped early: {self.stopped}; not measured: {', '.join(self.unmeasured) or 'nothing'}, so each "
            "worst.* figure is over the measured phases only (a lower bound of the full grid's for a figure where "
            "larger is worse)"
        )


def divergence_figures(phases: Mapping[str, Any]) -> dict[str, float]:
    """``PHASE.STAT`` of each phase's overall, and ``worst.STAT``, the worse phase by the metric registry's rule
    (``worst.kl_p99``: the larger; ``worst.same_top1``: the smaller). ``phases``: phase -> an object with
    ``overall.to_json()`` (a :class:`PhaseDivergence`)."""
    out: dict[str, float] = {}
    for phase, stats in phases.items():
        for key, value in flatten_figures(stats.overall.to_json()).items():
            out[f"{phase}.{key}"] = value
    for key in WORST_STATS:
        values = [v for k, v in out.items() if k.endswith(f".{key}") and not k.startswith("worst.")]
        if values:
            out[f"worst.{key}"] = functools.reduce(metric(f"worst.{key}").worse, values)
    return out


# -- exact comparison of full distributions ---------------------------------------------------


def exact_positions(base: Tensor, cand: Tensor, targets: Sequence[int], first: int) -> list[PositionStat]:
    """Row i of the logits predicts ``targets[i]``, the token at position ``first + i``."""
    import torch

    out: list[PositionStat] = []
    target = torch.tensor(list(targets), dtype=torch.long).unsqueeze(-1)
    for lo in range(0, base.shape[0], 256):
        lp = base[lo : lo + 256].double().log_softmax(-1)
        lq = cand[lo : lo + 256].double().log_softmax(-1)
        kl = (lp.exp() * (lp - lq)).sum(-1).clamp_min(0.0)
        same = lp.argmax(-1) == lq.argmax(-1)
        t = target[lo : lo + 256]
        dp = lq.gather(-1, t).exp().squeeze(-1) - lp.gather(-1, t).exp().squeeze(-1)
        for i, (k, s, d) in enumerate(zip(kl.tolist(), same.tolist(), dp.tolist(), strict=True)):
            out.append(PositionStat(first + lo + i, k, bool(s), d))
    return out


def _exact(base: InProcessBackend, cand: InProcessBackend, ids: list[int], decode_tokens: int) -> dict[str, Any]:
    prefill = exact_positions(base.prefill_logits(ids)[:-1], cand.prefill_logits(ids)[:-1], ids[1:], 1)
    n = len(ids)
    decode = exact_positions(
        base.decode_logits(ids, decode_tokens), cand.decode_logits(ids, decode_tokens), ids[n - decode_tokens :],
        n - decode_tokens,
    )  # fmt: skip
    return {"prefill": prefill, "decode": decode}


# -- top-k comparison over HTTP ----------------------------------------------------------------


def approx_kl(p: dict[str, float], q: dict[str, float]) -> float:
    """KL(p || q) over p's listed tokens plus one "rest" bucket (see :data:`APPROXIMATION`)."""
    if not p:
        return 0.0
    finite = [v for v in q.values() if v > LOGPROB_FLOOR]
    floor = min(finite) if finite else -30.0
    total = mass_p = mass_q = 0.0
    for token, lp in p.items():
        if lp == -math.inf:
            continue  # probability 0 on the baseline's side: no contribution
        lq = max(q.get(token, floor), LOGPROB_FLOOR)
        pt = math.exp(lp)
        total += pt * (lp - lq)
        mass_p += pt
        mass_q += math.exp(lq)
    rest_p, rest_q = max(0.0, 1.0 - mass_p), max(1e-12, 1.0 - mass_q)
    if rest_p > 1e-12:
        total += rest_p * math.log(rest_p / rest_q)
    return max(0.0, total)


def compare_dists(position: int, base: TokenDist, cand: TokenDist, truth: str) -> PositionStat:
    pb, pc = base.logprob_of(truth), cand.logprob_of(truth)
    dp = (
        None
        if pb is None and pc is None
        else math.exp(pc if pc is not None else -math.inf) - math.exp(pb if pb is not None else -math.inf)
    )
    return PositionStat(position, approx_kl(base.top, cand.top), base.argmax() == cand.argmax(), dp)


@dataclass(frozen=True)
class TopkSide:
    """What one backend answered for one sequence: its prompt logprobs and its greedy decode steps."""

    prompt: PromptLogprobs
    decode_start: int
    decode: list[TokenDist]


async def fetch_topk(backend: Backend, prompt: Prompt, decode_tokens: int, k: int) -> TopkSide:
    """One backend's side of a top-k comparison (also what a recording keeps of the baseline)."""
    lp = await backend.prompt_logprobs(prompt, k)
    start = len(lp.tokens) - decode_tokens
    prefix: Prompt = "".join(lp.tokens[:start]) if isinstance(prompt, str) else list(prompt)[:start]
    return TopkSide(lp, start, await backend.decode_logprobs(prefix, decode_tokens, k))


async def keyed_by_ids(side: TopkSide, mapper: Any, tally: KeyTally) -> TopkSide:
    """The side with every token keyed by its id (text keys mapped with the target's tokenizer)."""
    prompt = await prompt_by_ids(side.prompt, mapper, tally)
    return TopkSide(prompt, side.decode_start, await dists_by_ids(side.decode, mapper, tally))


def compare_topk(base: TopkSide, cand: TopkSide) -> dict[str, list[PositionStat]]:
    """Position by position, prefill then decode (up to the first differing greedy token)."""
    pb, pc = base.prompt, cand.prompt
    check_keys(pb.positions, pc.positions, "prefill")
    check_keys(base.decode, cand.decode, "decode")
    if pb.tokens != pc.tokens:
        raise ProbeError("the two backends tokenized the sequence differently", "compare servers of the same model")
    prefill = [
        compare_dists(j, b, c, pb.tokens[j])
        for j, (b, c) in enumerate(zip(pb.positions, pc.positions, strict=True))
        if b is not None and c is not None
    ]
    decode = []
    for i, (b, c) in enumerate(zip(base.decode, cand.decode, strict=False)):
        decode.append(compare_dists(base.decode_start + i, b, c, b.token))
        if b.token != c.token:
            break
    return {"prefill": prefill, "decode": decode}


def _k(dists: Sequence[TokenDist | None], asked: int) -> int:
    """The k a side returned: ``asked`` unless it capped it (a vLLM-style list adds the actual token: k + 1)."""
    return min(asked, max((len(d.top) for d in dists if d is not None), default=0))


async def _topk(
    base: Backend, cand: Backend, prompt: Prompt, decode_tokens: int, k: int, seen: dict[str, int], tally: KeyTally
) -> dict[str, Any]:
    mapper = mapper_of(cand, base)  # the target's tokenizer first
    sides = await asyncio.gather(fetch_topk(base, prompt, decode_tokens, k), fetch_topk(cand, prompt, decode_tokens, k))
    sb, sc = [await keyed_by_ids(side, mapper, tally) for side in sides]
    for name, side in (("baseline", sb), ("candidate", sc)):
        seen[name] = max(seen.get(name, 0), _k(side.prompt.positions, k), _k(side.decode, k))
    return compare_topk(sb, sc)


async def _describe(backend: Backend) -> str:
    describe = getattr(backend, "describe", None)
    return str(await describe()) if describe is not None else backend.name


async def _sequence(backend: Backend, settings: DivergenceSettings, length: int, index: int) -> Prompt:
    """A conversation (planted facts, filler, a question and its answer) cut to ``length`` tokens where
    the backend renders token ids; a server that only takes text gets the whole conversation."""
    seed = conversation_seed(settings.seed + 7_919, length, index)
    target = length + length // 4 + 64  # long enough to cut
    conv, _ = await build_conversation(f"D{length}-s{index}", target, (0.2, 0.8), seed, backend.count_tokens)
    prompt = await backend.render(conv.transcript(conv.facts[-1]))
    return prompt if isinstance(prompt, str) else list(prompt)[:length]


def _row(length: int, index: int, tokens: int, found: dict[str, list[PositionStat] | None]) -> dict[str, Any]:
    """One sequence as a results-file line: its positions' figures, phase by phase (a phase not yet measured:
    null, the prefill round of a sequential run)."""
    out: dict[str, Any] = {"length": length, "index": index, "tokens": tokens}
    for phase in PHASES:
        got = found.get(phase)
        out[phase] = None if got is None else [[st.position, st.kl, st.same_top1, st.dp] for st in got]
    return out


def _from_row(row: dict[str, Any]) -> tuple[int, dict[str, list[PositionStat] | None]]:
    found = {
        phase: None if row[phase] is None else [PositionStat(int(p), float(k), bool(t), d) for p, k, t, d in row[phase]]
        for phase in PHASES
    }
    if found["prefill"] is None:
        raise ValueError("no prefill")
    return int(row["tokens"]), found


class _Pair:
    """One sequence measured on both sides phase by phase: prefill first, then decode (a sequential run's rounds)."""

    def __init__(
        self, baseline: Backend, candidate: Backend, settings: DivergenceSettings, exact: bool,
        seen: dict[str, int], tally: KeyTally,
    ) -> None:  # fmt: skip
        self.baseline, self.candidate, self.settings, self.exact = baseline, candidate, settings, exact
        self.seen, self.tally = seen, tally
        self.sides: dict[tuple[int, int], Any] = {}  # top-k: each side's prompt logprobs, keyed by id

    async def prefill(self, job: tuple[int, int]) -> tuple[int, list[PositionStat]]:
        prompt = await _sequence(self.baseline, self.settings, *job)
        if self.exact:
            base, cand = self.baseline, self.candidate
            assert isinstance(base, InProcessBackend) and isinstance(cand, InProcessBackend)
            ids = list(prompt) if not isinstance(prompt, str) else base._ids(prompt)
            self.sides[job] = ids
            stats = exact_positions(base.prefill_logits(ids)[:-1], cand.prefill_logits(ids)[:-1], ids[1:], 1)
            return len(ids), stats
        k = self.settings.top_k
        mapper = mapper_of(self.candidate, self.baseline)
        lps = await asyncio.gather(self.baseline.prompt_logprobs(prompt, k), self.candidate.prompt_logprobs(prompt, k))
        pb, pc = [await prompt_by_ids(lp, mapper, self.tally) for lp in lps]
        for name, lp in (("baseline", pb), ("candidate", pc)):
            self.seen[name] = max(self.seen.get(name, 0), _k(lp.positions, k))
        check_keys(pb.positions, pc.positions, "prefill")
        if pb.tokens != pc.tokens:
            raise ProbeError("the two backends tokenized the sequence differently", "compare servers of the same model")
        start = len(lps[0].tokens) - self.settings.decode_tokens
        prefix: Prompt = "".join(lps[0].tokens[:start]) if isinstance(prompt, str) else list(prompt)[:start]
        self.sides[job] = (prefix, start)
        stats = [
            compare_dists(j, b, c, pb.tokens[j])
            for j, (b, c) in enumerate(zip(pb.positions, pc.positions, strict=True))
            if b is not None and c is not None
        ]
        return max((st.position for st in stats), default=0) + 1, stats

    async def decode(self, job: tuple[int, int]) -> list[PositionStat]:
        n = self.settings.decode_tokens
        if job not in self.sides:  # a resumed run: the prefill came from the results file
            await self.prefill(job)
        if self.exact:
            base, cand = self.baseline, self.candidate
            assert isinstance(base, InProcessBackend) and isinstance(cand, InProcessBackend)
            ids = self.sides[job]
            return exact_positions(
                base.decode_logits(ids, n), cand.decode_logits(ids, n), ids[len(ids) - n :], len(ids) - n
            )
        prefix, start = self.sides[job]
        k = self.settings.top_k
        mapper = mapper_of(self.candidate, self.baseline)
        sides = await asyncio.gather(
            self.baseline.decode_logprobs(prefix, n, k), self.candidate.decode_logprobs(prefix, n, k)
        )
        db, dc = [await dists_by_ids(d, mapper, self.tally) for d in sides]
        for name, d in (("baseline", db), ("candidate", dc)):
            self.seen[name] = max(self.seen.get(name, 0), _k(d, k))
        check_keys(db, dc, "decode")
        out = []
        for i, (b, c) in enumerate(zip(db, dc, strict=False)):
            out.append(compare_dists(start + i, b, c, b.token))
            if b.token != c.token:
                break
        return out


async def arun_divergence(
    baseline: Backend,
    candidate: Backend,
    settings: DivergenceSettings,
    *,
    results_path: Path | None = None,
    resume: bool = False,
    progress: Progress | bool = False,
    goal: DivergenceGoal | None = None,
) -> DivergenceReport:
    """The divergence probe, async (see :func:`run_divergence`)."""
    started = time.perf_counter()
    exact = isinstance(baseline, InProcessBackend) and isinstance(candidate, InProcessBackend)
    jobs = [(n, i) for n in settings.lengths for i in range(settings.sequences)]
    header = {"settings": settings.to_json(), "baseline": baseline.name, "candidate": candidate.name}
    store = ResultsFile(results_path, "divergence", header, resume) if results_path else None
    seen: dict[str, int] = {}
    tally = KeyTally()
    engines = {"baseline": await _describe(baseline), "candidate": await _describe(candidate)}
    if not exact:
        await check_same_tokenizer(baseline, candidate)
    finished: dict[tuple[int, int], tuple[int, dict[str, list[PositionStat] | None]]] = {}
    for row in store.done if store else []:
        try:
            finished[(int(row["length"]), int(row["index"]))] = _from_row(row)
        except (KeyError, TypeError, ValueError):
            continue  # a damaged line: that sequence runs again
    stopped: str | None = None
    pair = _Pair(baseline, candidate, settings, exact, seen, tally)
    done = sum(1 for f in finished.values() if f[1]["decode"] is not None)
    try:
        with progress_bar(progress, f"divergence {candidate.name}", len(jobs), done) as advance:
            if goal is None:  # the full grid, sequence by sequence
                for job in jobs:
                    if job in finished and finished[job][1]["decode"] is not None:
                        continue
                    if exact:
                        assert isinstance(baseline, InProcessBackend) and isinstance(candidate, InProcessBackend)
                        prompt = await _sequence(baseline, settings, *job)
                        ids = list(prompt) if not isinstance(prompt, str) else baseline._ids(prompt)
                        found: dict[str, list[PositionStat] | None] = {
                            **_exact(baseline, candidate, ids, settings.decode_tokens)
                        }
                        tokens = len(ids)
                    else:
                        prompt = await _sequence(baseline, settings, *job)
                        found = {
                            **await _topk(
                                baseline, candidate, prompt, settings.decode_tokens, settings.top_k, seen, tally
                            )
                        }
                        tokens = max((st.position for st in found["prefill"] or []), default=0) + 1
                    finished[job] = (tokens, found)
                    if store:
                        store.append(_row(*job, tokens, found))
                    advance()
            else:
                stopped = await _sequential(pair, goal, jobs, finished, store, advance)
    finally:
        if store:
            store.close()
    stats: dict[str, list[PositionStat]] = {p: [] for p in PHASES}
    lengths: list[int] = []
    departures: list[Departure | None] = []
    for job in jobs:  # in job order, whichever run measured each sequence
        tokens, got = finished[job]
        lengths.append(tokens)
        departures.append(None if got["decode"] is None else Departure.of(got["decode"]))
        for phase in PHASES:
            stats[phase].extend(got[phase] or [])
    unmeasured = ["decode"] if stopped is not None else []
    phases = {p: PhaseDivergence.of(stats[p], settings.bucket_size) for p in PHASES if p not in unmeasured}
    return DivergenceReport(
        baseline.name, candidate.name, settings, phases, _approximation(exact, settings.top_k, seen),
        time.perf_counter() - started, lengths, engines, seen, {} if exact else {"note": KEYING, **tally.to_json()},
        [] if stopped is not None else departures, goal, stopped, unmeasured,
    )  # fmt: skip


def decided_after_prefill(
    goal: DivergenceGoal, prefill: Sequence[Sequence[PositionStat]], decode_tokens: int
) -> str | None:
    """Where and why the probe stops after every sequence's prefill (one list of positions per sequence), or None
    when the decodes could still change the verdict (:mod:`speedtrap.probe._divergence_stop`)."""
    stats = [st for seq in prefill for st in seq]
    kl, same = [st.kl for st in stats], [st.same_top1 for st in stats]
    most = {"prefill": len(stats), "decode": decode_tokens * len(prefill)}
    if goal.decided({"prefill": (kl, same)}, most) != "prefill":
        return None
    why = stop_sentence(goal, "prefill", kl, same, most["prefill"])
    return f"stopped after the prefill of {len(prefill)} of {len(prefill)} sequences: {why}"


async def _sequential(
    pair: _Pair,
    goal: DivergenceGoal,
    jobs: list[tuple[int, int]],
    finished: dict[tuple[int, int], tuple[int, dict[str, list[PositionStat] | None]]],
    store: ResultsFile | None,
    advance: Any,
) -> str | None:
    """Rounds: every sequence's prefill, then (unless the verdict is decided) every sequence's decode. Returns
    where it stopped and why, or None when it measured the whole grid."""
    for job in jobs:
        if job not in finished:
            tokens, stats = await pair.prefill(job)
            finished[job] = (tokens, {"prefill": stats, "decode": None})
            if store:
                store.append(_row(*job, tokens, finished[job][1]))
    pending = [job for job in jobs if finished[job][1]["decode"] is None]
    if len(pending) == len(jobs):
        prefill = [finished[job][1]["prefill"] or [] for job in jobs]
        why = decided_after_prefill(goal, prefill, pair.settings.decode_tokens)
        if why is not None:
            return why
    for job in pending:
        tokens, got = finished[job]
        found = {"prefill": got["prefill"], "decode": await pair.decode(job)}
        finished[job] = (tokens, found)
        if store:
            store.append(_row(*job, tokens, found))
        advance()
    return None


def _approximation(exact: bool, k: int, seen: dict[str, int]) -> str | None:
    if exact:
        return None
    kb, kc = seen.get("baseline", k), seen.get("candidate", k)
    return APPROXIMATION.format(k=kb) if kb == kc else APPROXIMATION_K.format(kb=kb, kc=kc)


def run_divergence(
    baseline: Backend,
    candidate: Backend,
    settings: DivergenceSettings,
    *,
    results_path: Path | None = None,
    resume: bool = False,
    progress: Progress | bool = False,
    goal: DivergenceGoal | None = None,
) -> DivergenceReport:
    """Compare ``candidate``'s next-token distributions to ``baseline``'s, in prefill and decode.

    With ``results_path``, each finished sequence is written there at once; ``resume`` measures
    only the sequences missing from it (same settings and backends, else a one-line error).

    With ``goal`` (a verdict: metric, bound, direction) the probe measures in rounds, every sequence's prefill and
    then every decode, and stops after the prefill round when the rest cannot change the verdict
    (:mod:`speedtrap.probe._divergence_stop`: exact, no error rate); the report says where and why.
    """
    coro = arun_divergence(
        baseline, candidate, settings, results_path=results_path, resume=resume, progress=progress, goal=goal
    )
    return asyncio.run(coro)
