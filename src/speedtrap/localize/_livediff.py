"""Compare two live captures (base and trial) module by module, as the in-process layer diff does.

Rows are matched by (the call's ordinal within its forward, absolute position), so a chunked
prefill is compared row by row against a one-shot one. Decode positions are compared only while
every fed token so far is the same in both (the trial's greedy decode may leave the base's path:
after that the two runs see different inputs and a difference says nothing about the patch).
The statistics are the in-process ones (``_stats.compare_rows``: rel_diff, max |diff|, cosine, by
position bucket) over the channel sample both captures kept (every channel when a row has at most
``channels``); the result is the in-process :class:`LayerDiffResult`, assembled by the same code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from speedtrap._errors import UsageError
from speedtrap.localize._assemble import diff_result, module_diff
from speedtrap.localize._capture import Capture, ModuleRows, Noise
from speedtrap.localize._pairing import canonical
from speedtrap.localize._ranks import rank_notes, rank_pairs
from speedtrap.localize._results import LayerDiffResult, ModuleDiff, layer_of
from speedtrap.localize._stats import Accumulator, compare_rows, position_edges

# A module over the threshold must also differ ten times more than the same request sent twice to
# the base server differs from itself (its ``noise``): below that, a difference is the stack's own.
NOISE_MARGIN = 10.0
_OCC = 1 << 20  # row key: position * _OCC + the call's ordinal within its forward


@dataclass
class _Rec:
    order: int
    acc: Accumulator
    calls: int = 0
    compared: int = 0
    mismatched: bool = False
    notes: list[str] = field(default_factory=list)


def fed_tokens(capture: Capture) -> dict[int, int]:
    """Absolute position -> the token id fed there, over every row of the capture."""
    fed: dict[int, int] = {}
    for m in capture.modules:
        for p, t in zip(m.rows["pos"].tolist(), m.rows["ids"].tolist(), strict=True):
            fed.setdefault(p, t)
    return fed


def common_positions(base: Capture, trial: Capture) -> int:
    """How many leading positions both fed identically (the prompt, then decode while the paths agree).

    The prompt's positions count as fed with the prompt's ids when both captures sent the same prompt: a
    decode-only role (a disaggregated stack's decode) never runs the prompt, yet its decode rows follow it.
    """
    a, b = fed_tokens(base), fed_tokens(trial)
    if base.prompt == trial.prompt:
        for i, t in enumerate(base.prompt):
            a.setdefault(i, t)
            b.setdefault(i, t)
    n = 0
    while n in a and n in b and a[n] == b[n]:
        n += 1
    return n


def compare_captures(
    base: Capture, trial: Capture, threshold: float = 1e-8, *, target: str | None = None
) -> LayerDiffResult:
    """Every module of ``trial`` against ``base``: the first divergent module and the growth by layer.

    The threshold used is ``max(threshold, NOISE_MARGIN * base.noise.rel_diff)`` (the result carries it).
    """
    if threshold <= 0:
        raise UsageError(f"threshold {threshold} must be positive", "pass e.g. --threshold 1e-8")
    limit = common_positions(base, trial)
    if limit == 0:
        raise UsageError(
            "the base and trial captures share no fed token at position 0",
            "capture both with the same prompt token ids",
        )
    effective = max(threshold, NOISE_MARGIN * base.noise.rel_diff) if base.noise else threshold
    edges = position_edges(limit)
    records: dict[str, _Rec] = {}
    pairs = rank_pairs(base, trial)  # rank by rank at one world size, else the unsharded views
    for b, t in pairs:
        _compare(b, t, limit, edges, records)
    _rank_notes(base, trial, records, len(pairs) > 1)
    modules = [module_diff(n, r.calls, r.compared, r.acc, r.notes, r.mismatched) for n, r in records.items()]
    matched = {canonical(m.name) for m in trial.modules} | {m.name for m in trial.modules} | set(records)
    for m in base.modules:
        if m.name not in matched and canonical(m.name) not in matched:
            matched.add(m.name)
            modules.append(ModuleDiff(m.name or "(model)", layer_of(m.name), "baseline_only", 1, 0))
    decode = max(0, limit - len(trial.prompt))
    return diff_result(target or trial.stack, trial.label, base.label, limit, decode, effective, edges, modules)


def _rank_notes(base: Capture, trial: Capture, records: dict[str, _Rec], by_rank: bool) -> None:
    """Ranks that disagree on a replicated output, and (across world sizes) the trial's rank-local outputs."""
    for capture in (base, trial):
        for module, notes in rank_notes(capture).items():
            rec = records.setdefault(module, _Rec(len(records), Accumulator(1)))
            rec.notes.extend(notes)
    if by_rank or base.world == trial.world:
        return
    for name in trial.extra.get("ranks", {}).get("rank_local", []):
        rec = records.setdefault(name, _Rec(len(records), Accumulator(1)))
        rec.mismatched = True
        rec.notes.append(
            f"rank-local at TP {trial.world} (its ranks differ and no layout is declared): not comparable with TP "
            f"{base.world}"
        )


def _compare(
    base: Capture, trial: Capture, limit: int, edges: list[int], records: dict[str, _Rec] | None = None
) -> dict[str, _Rec]:
    by_name = {(m.name, m.tensor): m for m in base.modules}
    records = {} if records is None else records
    for y in trial.modules:
        rec = records.setdefault(y.name, _Rec(len(records), Accumulator(len(edges) - 1)))
        calls = _calls(y)
        rec.calls = max(rec.calls, len(calls))
        x = by_name.get((y.name, y.tensor)) or by_name.get((canonical(y.name), y.tensor))
        if x is None:
            continue
        if x.features != y.features or x.rows["x"].shape[1] != y.rows["x"].shape[1]:
            rec.mismatched = True
            if not rec.notes:
                rec.notes.append(f"not comparable: base rows of {x.features} features, trial {y.features}")
            continue
        rows_x, rows_y, positions, groups = _matched(x, y, limit)
        if positions.numel() == 0:
            continue
        compare_rows(rows_x, rows_y, positions, edges, rec.acc)
        rec.compared = max(rec.compared, groups)
    return records


def _calls(m: ModuleRows) -> set[tuple[int, int]]:
    return set(zip(m.rows["fwd"].tolist(), m.rows["occ"].tolist(), strict=True))


def _matched(x: ModuleRows, y: ModuleRows, limit: int) -> tuple[Tensor, Tensor, Tensor, int]:
    """The rows of ``x`` and ``y`` at the same (position, ordinal), positions below ``limit``."""
    index: dict[int, int] = {}
    for i, key in enumerate((x.rows["pos"] * _OCC + x.rows["occ"]).tolist()):
        index.setdefault(key, i)
    pick_x, pick_y = [], []
    groups: set[tuple[int, int]] = set()
    seen: set[int] = set()
    y_pos, y_fwd, y_occ = y.rows["pos"].tolist(), y.rows["fwd"].tolist(), y.rows["occ"].tolist()
    for j, (p, f, o) in enumerate(zip(y_pos, y_fwd, y_occ, strict=True)):
        key = p * _OCC + o
        if p >= limit or key in seen or key not in index:
            continue
        seen.add(key)
        pick_x.append(index[key])
        pick_y.append(j)
        groups.add((f, o))
    ix, iy = torch.tensor(pick_x, dtype=torch.long), torch.tensor(pick_y, dtype=torch.long)
    return x.rows["x"][ix], y.rows["x"][iy], y.rows["pos"][iy], len(groups)


def noise_of(first: Capture, second: Capture) -> Noise:
    """The same request twice in one server: the largest module rel_diff between the two captures."""
    limit = common_positions(first, second)
    records = _compare(first, second, limit, position_edges(max(limit, 1)))
    worst = max(
        ((name, r.acc.rel_diff) for name, r in records.items() if r.compared), key=lambda kv: kv[1], default=None
    )
    return Noise(worst[1] if worst else 0.0, worst[0] if worst and worst[1] > 0 else None, limit)
