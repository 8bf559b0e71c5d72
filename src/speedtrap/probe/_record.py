"""Recording a baseline, and measuring a candidate against a recording instead of a live baseline.

In-process, a recording keeps per position the baseline's top-k token ids and logprobs and the exact
tail mass (the rest of the vocabulary, computed in log space); the candidate's full distribution is
then compared with it as a distribution over k + 1 outcomes: the recorded top-k tokens and the rest
(a lower bound of the full KL, by the data-processing inequality). Over HTTP a recording keeps what
the server answered (top-k logprobs of the prompt, the greedy continuation and its steps) and the
comparison is the live one's (:func:`compare_topk`), with the baseline's side read from the file.
"""

from __future__ import annotations

import asyncio
import datetime
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from speedtrap._errors import UsageError
from speedtrap.probe._backend import Backend, Prompt, PromptLogprobs, TokenDist
from speedtrap.probe._divergence import (
    APPROXIMATION,
    PHASES,
    Departure,
    DivergenceReport,
    DivergenceSettings,
    TopkSide,
    _sequence,
    compare_topk,
    decided_after_prefill,
    fetch_topk,
)
from speedtrap.probe._divergence_stop import DivergenceGoal
from speedtrap.probe._inprocess import InProcessBackend
from speedtrap.probe._progress import progress_bar
from speedtrap.probe._recall import RecallReport, RecallSettings, arun_recall
from speedtrap.probe._recording import (
    Identity,
    Recording,
    backend_identity,
    identity_mismatch,
    identity_notes,
    read_recording,
    settings_mismatch,
)
from speedtrap.probe._recording_format import (
    FORMAT,
    VERSION,
    Block,
    Names,
    RecordingWriter,
    SequenceRecord,
    parse_recording,
)
from speedtrap.probe._results import PhaseDivergence, RecallSample
from speedtrap.probe._stats import PositionStat

if TYPE_CHECKING:
    from torch import Tensor

BUCKET_APPROXIMATION = (
    "recorded baseline: KL over the baseline's top-{k} tokens plus one bucket for the rest of the vocabulary "
    "(tail mass recorded exactly), against the candidate's full distribution: a lower bound of the full KL; "
    "decode teacher-forced"
)
ROWS = 256  # logits rows turned into log-probabilities at once (float64: 400 MB per 1,024 rows otherwise)


def _version() -> str:
    try:
        return metadata.version("speedtrap")
    except metadata.PackageNotFoundError:
        return "0"


# -- in-process: top-k + exact tail from full logits -------------------------------------------


def block_from_logits(logits: Tensor, truths: Sequence[int], first: int, k: int) -> Block:
    """Row i of ``logits`` predicts ``truths[i]`` at position ``first + i``: its top-k, own logprob and tail."""
    import torch

    ids, lps, own, tail = [], [], [], []
    target = torch.tensor(list(truths), dtype=torch.long).unsqueeze(-1)
    for lo in range(0, logits.shape[0], ROWS):
        lp = logits[lo : lo + ROWS].double().log_softmax(-1)
        values, idx = lp.topk(min(k, lp.shape[-1]))
        ids.append(idx)
        lps.append(values)
        own.append(lp.gather(-1, target[lo : lo + ROWS]).squeeze(-1))
        tail.append(lp.scatter(-1, idx, -math.inf).logsumexp(-1).exp())
    n = logits.shape[0]
    kk = ids[0].shape[-1] if ids else k
    return Block(
        np.arange(first, first + n, dtype="<i4"), np.full(n, kk, dtype="<u2"),
        torch.cat(ids).flatten().numpy().astype("<i4") if ids else np.zeros(0, "<i4"),
        torch.cat(lps).flatten().numpy().astype("<f4") if lps else np.zeros(0, "<f4"),
        torch.cat(own).numpy().astype("<f4") if own else np.zeros(0, "<f4"),
        torch.cat(tail).numpy().astype("<f4") if tail else np.zeros(0, "<f4"),
    )  # fmt: skip


def bucket_positions(block: Block, cand_logits: Tensor, truths: Sequence[int]) -> list[PositionStat]:
    """The candidate's full distribution against a recorded block, over the recorded top-k plus the rest."""
    import torch

    n = len(block.positions)
    if n == 0:
        return []
    if cand_logits.shape[0] != n or len(set(block.counts.tolist())) != 1:
        raise UsageError("the recording's positions do not match this sequence", "record the baseline again")
    k = int(block.counts[0])
    ids = torch.from_numpy(block.ids.astype(np.int64)).view(n, k)
    lp_top = torch.from_numpy(block.logprobs.astype(np.float64)).view(n, k)
    log_tail_p = torch.from_numpy(block.tail.astype(np.float64)).log()
    own = torch.from_numpy(block.own.astype(np.float64))
    target = torch.tensor(list(truths), dtype=torch.long).unsqueeze(-1)
    out: list[PositionStat] = []
    for lo in range(0, n, ROWS):
        hi = min(n, lo + ROWS)
        lq = cand_logits[lo:hi].double().log_softmax(-1)
        idx = ids[lo:hi]
        lq_top = lq.gather(-1, idx)
        log_tail_q = lq.scatter(-1, idx, -math.inf).logsumexp(-1)
        p_top = lp_top[lo:hi].exp()
        kl = (p_top * (lp_top[lo:hi] - lq_top)).sum(-1)
        ltp = log_tail_p[lo:hi]
        kl = kl + torch.where(ltp > -math.inf, ltp.exp() * (ltp - log_tail_q), torch.zeros_like(ltp))
        same = idx[:, 0] == lq.argmax(-1)
        dp = lq.gather(-1, target[lo:hi]).squeeze(-1).exp() - own[lo:hi].exp()
        for i, (v, s, d) in enumerate(zip(kl.clamp_min(0.0).tolist(), same.tolist(), dp.tolist(), strict=True)):
            out.append(PositionStat(int(block.positions[lo + i]), v, bool(s), d))
    return out


def _record_in_process(
    backend: InProcessBackend, length: int, index: int, ids: list[int], decode_tokens: int, k: int
) -> SequenceRecord:
    n = len(ids)
    prefill = block_from_logits(backend.prefill_logits(ids)[:-1], ids[1:], 1, k)
    decode = block_from_logits(
        backend.decode_logits(ids, decode_tokens), ids[n - decode_tokens :], n - decode_tokens, k
    )
    tail = tuple(ids[n - decode_tokens :])
    return SequenceRecord(
        length, index, tuple(ids), None, Names(None), tuple(ids), prefill, "teacher_forced", n - decode_tokens, tail,
        decode,
    )  # fmt: skip


# -- over HTTP: what the server answered -------------------------------------------------------


def record_side(length: int, index: int, prompt: Prompt, side: TopkSide) -> SequenceRecord:
    tokens = side.prompt.tokens
    names = Names.for_names([*tokens, *(d.token for d in side.decode),
                             *(t for d in side.prompt.positions if d for t in d.top),
                             *(t for d in side.decode for t in d.top)])  # fmt: skip
    present = [(j, d) for j, d in enumerate(side.prompt.positions) if d is not None]
    prefill = Block.of_dists([j for j, _ in present], [d for _, d in present], names)
    steps = side.decode
    decode = Block.of_dists([side.decode_start + i for i in range(len(steps))], steps, names)
    return SequenceRecord(
        length, index, None if isinstance(prompt, str) else tuple(int(t) for t in prompt),
        prompt if isinstance(prompt, str) else None, names, tuple(names.code(t) for t in tokens), prefill, "greedy",
        side.decode_start, tuple(names.code(d.token) for d in steps), decode,
    )  # fmt: skip


def recorded_side(seq: SequenceRecord) -> TopkSide:
    """The baseline's side of a top-k comparison, read back from a recording."""
    tokens = seq.token_names()
    positions: list[TokenDist | None] = [None] * len(tokens)
    dists = seq.prefill.dists([tokens[int(j)] for j in seq.prefill.positions], seq.names)
    for j, d in zip(seq.prefill.positions.tolist(), dists, strict=True):
        positions[j] = d
    decode = seq.decode.dists([seq.names.name(t) for t in seq.decode_tokens], seq.names)
    return TopkSide(PromptLogprobs(tokens, positions, 0, "recording"), seq.decode_start, decode)


def seq_prompt(seq: SequenceRecord) -> Prompt:
    return list(seq.prompt_ids) if seq.prompt_ids is not None else str(seq.prompt_text)


# -- recording ---------------------------------------------------------------------------------


def _header(
    identity: Identity, target: str, div: DivergenceSettings | None, rec: RecallSettings | None
) -> dict[str, Any]:
    return {
        "type": "header",
        "format": FORMAT,
        "version": VERSION,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "speedtrap": _version(),
        "target": target,
        "identity": identity.to_json(),
        "probes": {"divergence": div.to_json() if div else None, "recall": rec.to_json() if rec else None},
    }


async def arecord(
    backend: Backend,
    out: Path,
    *,
    divergence: DivergenceSettings | None = None,
    recall: RecallSettings | None = None,
    resume: bool = False,
    progress: bool = True,
    target: str = "",
) -> Recording:
    """Record ``backend`` as a baseline into ``out`` (see :func:`record`)."""
    if divergence is None and recall is None:
        raise UsageError("nothing to record", "pass --probe divergence, recall or all")
    identity = await backend_identity(backend)
    header = _header(identity, target or backend.name, divergence, recall)
    out = Path(out)
    done_seq: set[tuple[int, int]] = set()
    done_samples: list[RecallSample] = []
    if out.exists() and out.stat().st_size > 0:
        if not resume:
            raise UsageError(f"recording {str(out)!r} already exists", "pass --resume to finish it, or another --out")
        raw = parse_recording(out.read_bytes(), str(out))
        _same_run(raw.header, header, str(out))
        if raw.complete:
            return read_recording(out)
        done_seq = {s.key for s in raw.sequences}
        done_samples = [RecallSample.from_json(s) for s in raw.recall]
        writer = RecordingWriter(out, None, raw.good_bytes)
    else:
        writer = RecordingWriter(out, header)
    try:
        if divergence is not None:
            await _record_divergence(backend, divergence, writer, done_seq, progress)
        if recall is not None:
            await arun_recall(
                backend, recall, progress=progress, known=done_samples,
                on_sample=lambda s: writer.write({"type": "recall.sample", **s.to_json()}),
            )  # fmt: skip
        writer.write({"type": "end"})
    finally:
        writer.close()
    return read_recording(out)


def _same_run(old: dict[str, Any], new: dict[str, Any], where: str) -> None:
    for key in ("probes", "identity"):
        for field_name in sorted(set(old[key]) | set(new[key])):
            a, b = old[key].get(field_name), new[key].get(field_name)
            if a != b and not (key == "identity" and field_name == "server_version"):
                raise UsageError(
                    f"{where} was started with {key} {field_name} = {a!r}, this run has {b!r}",
                    "resume with the same target and settings, or record into a new --out",
                )


async def _record_divergence(
    backend: Backend, settings: DivergenceSettings, writer: RecordingWriter, done: set[tuple[int, int]], progress: bool
) -> None:
    jobs = [(n, i) for n in settings.lengths for i in range(settings.sequences)]
    with progress_bar(progress, f"record divergence {backend.name}", len(jobs), len(done)) as advance:
        for n, i in jobs:
            if (n, i) in done:
                continue
            prompt = await _sequence(backend, settings, n, i)
            if isinstance(backend, InProcessBackend):
                ids = backend._ids(prompt)
                seq = _record_in_process(backend, n, i, ids, settings.decode_tokens, settings.top_k)
            else:
                side = await fetch_topk(backend, prompt, settings.decode_tokens, settings.top_k)
                seq = record_side(n, i, prompt, side)
            writer.write(seq.to_json())
            advance()


def record(
    backend: Backend,
    out: Path,
    *,
    divergence: DivergenceSettings | None = None,
    recall: RecallSettings | None = None,
    resume: bool = False,
    progress: bool = True,
    target: str = "",
) -> Recording:
    """Run the probes on ``backend`` and write what it answered to ``out``, record by record.

    ``resume`` continues an interrupted recording (same target and settings, else a one-line
    error); a complete one is returned as it is.
    """
    coro = arecord(backend, out, divergence=divergence, recall=recall, resume=resume, progress=progress, target=target)
    return asyncio.run(coro)


# -- against a recording -----------------------------------------------------------------------


@dataclass
class RecallComparison:
    """Recall of a candidate against the recorded baseline's answers (same conversations)."""

    baseline: RecallReport
    candidate: RecallReport
    changed: list[str]  # sample ids whose answer differs from the recorded one

    @property
    def drop(self) -> float:
        return self.baseline.overall.accuracy - self.candidate.overall.accuracy

    @property
    def overlap(self) -> bool:
        """Whether the two Wilson 95% intervals overlap."""
        return self.candidate.overall.high >= self.baseline.overall.low

    def to_json(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline.overall.to_json(),
            "candidate": self.candidate.to_json(),
            "drop": self.drop,
            "intervals_overlap": self.overlap,
            "answers_changed": len(self.changed),
            "changed": self.changed,
        }


@dataclass
class AgainstRecording:
    """A candidate measured against a recording: divergence and/or recall, and notes (server version)."""

    recording: str
    notes: list[str] = field(default_factory=list)
    divergence: DivergenceReport | None = None
    recall: RecallComparison | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "recording": self.recording,
            "notes": self.notes,
            "divergence": self.divergence.to_json() if self.divergence else None,
            "recall": self.recall.to_json() if self.recall else None,
        }


def resolve_settings(recording: Recording, kind: str, asked: Any | None) -> Any:
    """The recording's settings of ``kind``; settings asked for must equal them (else one line naming the field)."""
    recorded = recording.divergence if kind == "divergence" else recording.recall
    if recorded is None:
        raise UsageError(f"the recording {recording.path!r} holds no {kind} probe", f"record it with --probe {kind}")
    if asked is not None:
        error = settings_mismatch(f"{kind} setting", recorded.to_json(), asked.to_json())
        if error is not None:
            raise error
    return recorded


async def check_identity(recording: Recording, candidate: Backend) -> list[str]:
    """Refuse a candidate of another model, tokenizer or weights; notes for a harmless difference."""
    current = await backend_identity(candidate, weights=recording.identity.weights is not None)
    error = identity_mismatch(recording.identity, current)
    if error is not None:
        raise error
    return identity_notes(recording.identity, current)


async def adivergence_against(
    recording: Recording,
    candidate: Backend,
    settings: DivergenceSettings | None = None,
    *,
    progress: bool = True,
    goal: DivergenceGoal | None = None,
) -> DivergenceReport:
    """Divergence of ``candidate`` from the recorded baseline, on the recorded sequences.

    With ``goal``, every sequence's prefill first, then the decodes unless the verdict is already decided
    (``arun_divergence``'s exact stop)."""
    settings = resolve_settings(recording, "divergence", settings)
    assert settings is not None
    started = time.perf_counter()
    in_process = recording.identity.source == "in-process"
    if in_process and not isinstance(candidate, InProcessBackend):
        raise UsageError("an in-process recording needs an in-process target", "record over HTTP")
    order = {(n, i): r for r, (n, i) in enumerate((n, i) for n in settings.lengths for i in range(settings.sequences))}
    sequences = sorted(recording.sequences, key=lambda s: order[s.key])
    n_dec, k = settings.decode_tokens, settings.top_k
    prefills: list[list[PositionStat]] = []
    sides: list[Any] = []
    lengths: list[int] = []
    stopped: str | None = None
    with progress_bar(progress, f"divergence {candidate.name} vs recording", len(sequences), 0) as advance:
        for seq in sequences:  # the prefill round
            if in_process:
                assert isinstance(candidate, InProcessBackend)
                if seq.decode_mode != "teacher_forced" or len(seq.decode_tokens) != n_dec:
                    raise UsageError("the recording's decode pass does not match these settings", "record again")
                ids = list(seq.tokens)
                prefills.append(bucket_positions(seq.prefill, candidate.prefill_logits(ids)[:-1], ids[1:]))
                sides.append(ids)
                lengths.append(len(ids))
            else:
                base = recorded_side(seq)
                lp = await candidate.prompt_logprobs(seq_prompt(seq), k)
                start = len(lp.tokens) - n_dec
                found = compare_topk(TopkSide(base.prompt, base.decode_start, []), TopkSide(lp, start, []))
                prefills.append(found["prefill"])
                sides.append((base, lp, start))
                lengths.append(max((st.position for st in found["prefill"]), default=0) + 1)
        if goal is not None:
            stopped = decided_after_prefill(goal, prefills, n_dec)
        decodes: list[list[PositionStat]] = []
        for seq, side in zip(sequences, sides, strict=True) if stopped is None else ():  # the decode round
            if in_process:
                assert isinstance(candidate, InProcessBackend)
                ids = side
                decodes.append(
                    bucket_positions(seq.decode, candidate.decode_logits(ids, n_dec), ids[len(ids) - n_dec :])
                )
            else:
                base, lp, start = side
                prompt = seq_prompt(seq)
                prefix: Prompt = "".join(lp.tokens[:start]) if isinstance(prompt, str) else list(prompt)[:start]
                steps = await candidate.decode_logprobs(prefix, n_dec, k)
                decodes.append(compare_topk(base, TopkSide(lp, start, steps))["decode"])
            advance()
    stats = {"prefill": [st for p in prefills for st in p], "decode": [st for d in decodes for st in d]}
    unmeasured = ["decode"] if stopped is not None else []
    phases = {p: PhaseDivergence.of(stats[p], settings.bucket_size) for p in PHASES if p not in unmeasured}
    departures = [Departure.of(d) for d in decodes]
    approx = (BUCKET_APPROXIMATION if in_process else APPROXIMATION + " (baseline from a recording)").format(k=k)
    baseline = f"recording {Path(recording.path).name} [{recording.identity.model}]"
    elapsed = time.perf_counter() - started
    return DivergenceReport(
        baseline, candidate.name, settings, phases, approx, elapsed, lengths, departures=departures, goal=goal,
        stopped=stopped, unmeasured=unmeasured,
    )  # fmt: skip


async def arecall_against(recording: Recording, candidate: Backend, *, progress: bool = True) -> RecallComparison:
    settings = resolve_settings(recording, "recall", None)
    baseline = RecallReport(f"recording {Path(recording.path).name}", settings, list(recording.samples))
    report = await arun_recall(candidate, settings, progress=progress)
    recorded = baseline.answers()
    changed = sorted(sid for sid, answer in report.answers().items() if recorded.get(sid) != answer)
    return RecallComparison(baseline, report, changed)


async def aagainst(
    recording: Recording,
    candidate: Backend,
    kinds: Sequence[str] | None = None,
    divergence: DivergenceSettings | None = None,
    *,
    progress: bool = True,
) -> AgainstRecording:
    """Every probe the recording holds (or ``kinds``), on ``candidate``, after the identity check."""
    kinds = list(kinds) if kinds is not None else recording.kinds
    notes = await check_identity(recording, candidate)
    result = AgainstRecording(recording.path, notes)
    if "divergence" in kinds:
        result.divergence = await adivergence_against(recording, candidate, divergence, progress=progress)
    if "recall" in kinds:
        result.recall = await arecall_against(recording, candidate, progress=progress)
    return result


def run_against(
    recording: Recording,
    candidate: Backend,
    kinds: Sequence[str] | None = None,
    divergence: DivergenceSettings | None = None,
    *,
    progress: bool = True,
) -> AgainstRecording:
    """Measure ``candidate`` against ``recording`` (identity checked first; settings from the recording)."""

    async def go() -> AgainstRecording:
        try:
            return await aagainst(recording, candidate, kinds, divergence, progress=progress)
        finally:
            await candidate.aclose()

    return asyncio.run(go())
