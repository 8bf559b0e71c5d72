"""Layer diff: the same tokens through a baseline and a patched configuration, every module compared.

    from speedtrap.localize import layer_diff
    result = layer_diff(model, ["mhc_bf16_gemm"], ids)
    result.first_divergent  # "layers.0.attn_hc.proj"

See ``_pairing.py`` for how the two runs are kept in lock-step with bounded memory.
"""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor, nn

from speedtrap._errors import PatchError, SpeedtrapError, TargetError, UsageError
from speedtrap.localize._assemble import diff_result, module_diff
from speedtrap.localize._heads import stub_output_head
from speedtrap.localize._pairing import (
    RECOMPUTE_CHUNK_ELEMENTS,
    CompareError,
    Entry,
    Pairing,
    Recompute,
    SideState,
    float_tensors,
    position_dim,
    register,
)
from speedtrap.localize._results import LayerDiffResult, ModuleDiff, layer_of
from speedtrap.localize._stats import Accumulator, as_rows, compare_rows, position_edges
from speedtrap.targets import InProcessModel

# Measured on smol-moe (64 and 1,024 tokens; see the README's localize section): harmless kernel
# swaps stay below 1e-10 everywhere, logits included (float reordering grows across 30 layers from
# ~1e-14 to ~1e-11), while a bf16 GEMM starts at ~1e-6 in the module it changes. 1e-8 sits between.
DEFAULT_THRESHOLD = 1e-8


def shared_copy(module: nn.Module) -> nn.Module:
    """A structural copy of ``module`` that shares every parameter and buffer (no weight memory)."""
    memo: dict[int, Any] = {id(t): t for t in itertools.chain(module.parameters(), module.buffers())}
    return copy.deepcopy(module, memo)


@dataclass
class _Record:
    name: str
    order: int
    acc: Accumulator
    calls: int = 0
    compared: int = 0
    mismatches: int = 0
    unmatched: int = 0
    notes: list[str] = field(default_factory=list)


class _Collector:
    """Receives each patched module output with its baseline entry and accumulates statistics."""

    def __init__(self, pairing: Pairing, edges: list[int], dump: Path | None) -> None:
        self.pairing = pairing
        self.edges = edges
        self.dump = dump
        self.records: dict[str, _Record] = {}
        self.last: dict[str, Accumulator] = {}  # canonical name -> the sums of its latest comparison
        self.dumped = 0

    def record(self, name: str) -> _Record:
        rec = self.records.get(name)
        if rec is None:
            rec = _Record(name, len(self.records), Accumulator(len(self.edges) - 1))
            self.records[name] = rec
        return rec

    def __call__(
        self, name: str, alias: str, entry: Entry | None, ys: list[Tensor], side: SideState, peek: bool
    ) -> None:
        """``peek``: ``X.inner`` compared with the baseline's ``X``; the wrapper ``X`` consumes it."""
        rec = self.record(name)
        rec.calls += 1
        if entry is None:
            rec.unmatched += 1
            return
        same_call = entry.offset == side.offset and entry.tokens == side.tokens
        covered = entry.tokens if same_call else side.tokens
        one: Accumulator | None
        if alias and entry.alias_of == alias and alias in self.last:
            one = self.last[alias]  # the very tensors already compared under another name
        elif entry.recompute is not None:
            one = self._compare_recomputed(rec, entry, ys, side)
        else:
            one = self._compare(rec, entry, ys, side)
        if one is None:
            rec.mismatches += 1
            self.last.pop(entry.name, None)
            if not peek:
                entry.covered = entry.tokens
            return
        rec.acc.merge_from(one)
        rec.compared += 1
        if not peek:
            entry.covered += covered
            self.last[entry.name] = one

    def _slices(self, entry: Entry, ys: list[Tensor], side: SideState) -> list[tuple[Tensor, int | None, int]] | None:
        """Per tensor: the baseline tensor (or slice) matching the patched one, its position dim, start."""
        if len(ys) != len(entry.tensors):
            return None
        out: list[tuple[Tensor, int | None, int]] = []
        for x, y, dim in zip(entry.tensors, ys, entry.pos_dims, strict=True):
            if x.shape == y.shape and entry.offset == side.offset and entry.tokens == side.tokens:
                out.append((x, dim, 0))
                continue
            start = side.offset - entry.offset
            if (
                dim is None
                or entry.name in side.pre_embedding
                or x.dim() != y.dim()
                or y.shape[dim] != side.tokens
                or any(a != b for i, (a, b) in enumerate(zip(x.shape, y.shape, strict=True)) if i != dim)
                or start < 0
                or start + side.tokens > entry.tokens
            ):
                return None
            out.append((x.narrow(dim, start, side.tokens), dim, start))
        return out

    def _compare(self, rec: _Record, entry: Entry, ys: list[Tensor], side: SideState) -> Accumulator | None:
        slices = self._slices(entry, ys, side)
        if slices is None:
            if not rec.notes:
                shapes = [tuple(t.shape) for t in entry.tensors], [tuple(t.shape) for t in ys]
                rec.notes.append(f"not comparable: baseline shapes {shapes[0]}, patched {shapes[1]}")
            return None
        one = Accumulator(rec.acc.buckets)
        for (x, dim, start), y, x_sq in zip(slices, ys, entry.x_sq, strict=True):
            rows_x, rows_y = as_rows(x, dim), as_rows(y, dim)
            positions = None if dim is None else torch.arange(side.offset, side.offset + rows_y.shape[0])
            sq = None if x_sq is None else x_sq[start : start + rows_x.shape[0]]
            compare_rows(rows_x, rows_y, positions, self.edges, one, sq)
        if self.dump is not None:
            self._dump(rec.name, [s[0] for s in slices], ys)
        return one

    def _compare_recomputed(self, rec: _Record, entry: Entry, ys: list[Tensor], side: SideState) -> Accumulator | None:
        """The baseline output was not kept: recompute it from its inputs, a chunk of positions at a time."""
        plan = entry.recompute
        assert plan is not None
        dim = entry.pos_dims[0]
        start = side.offset - entry.offset
        if len(ys) != 1 or dim is None or ys[0].dim() <= dim or ys[0].shape[dim] != side.tokens:
            rec.notes.append("not comparable: the patched output has another shape")
            return None
        if start < 0 or start + side.tokens > entry.tokens:
            return None
        rows_y = as_rows(ys[0], dim)
        step = max(1, RECOMPUTE_CHUNK_ELEMENTS // max(1, rows_y.shape[1]))
        one = Accumulator(rec.acc.buckets)
        self.pairing.recomputing = True
        try:
            for lo in range(0, side.tokens, step):
                hi = min(lo + step, side.tokens)
                args = _narrow_all(plan.args, entry.tokens, start + lo, hi - lo)
                kwargs = _narrow_all(plan.kwargs, entry.tokens, start + lo, hi - lo)
                out = plan.forward(*args, **kwargs)
                rows_x = as_rows(float_tensors(out)[0], dim)
                if not _edge_rows_match(rows_x, plan, start + lo, start + hi, entry.tokens):
                    rec.notes.append("not comparable: the baseline module is not position-wise")
                    return None
                positions = torch.arange(side.offset + lo, side.offset + hi)
                compare_rows(rows_x, rows_y[lo:hi], positions, self.edges, one)
        finally:
            self.pairing.recomputing = False
        return one

    def _dump(self, name: str, xs: list[Tensor], ys: list[Tensor]) -> None:
        from safetensors.torch import save_file

        assert self.dump is not None
        tensors = {f"baseline.{i}": x.detach().contiguous().clone() for i, x in enumerate(xs)}
        tensors |= {f"patched.{i}": y.detach().contiguous().clone() for i, y in enumerate(ys)}
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "model"
        save_file(tensors, str(self.dump / f"{self.dumped:05d}-{safe}.safetensors"))
        self.dumped += 1


def _narrow_all(obj: Any, tokens: int, start: int, length: int) -> Any:
    """Slice every floating tensor along its position dimension (found by the call's token count)."""
    if isinstance(obj, Tensor):
        dim = position_dim(obj, tokens) if obj.is_floating_point() else None
        return obj if dim is None else obj.narrow(dim, start, length)
    if isinstance(obj, tuple):
        return tuple(_narrow_all(v, tokens, start, length) for v in obj)
    if isinstance(obj, list):
        return [_narrow_all(v, tokens, start, length) for v in obj]
    if isinstance(obj, dict):
        return {k: _narrow_all(v, tokens, start, length) for k, v in obj.items()}
    return obj


def _edge_rows_match(rows: Tensor, plan: Recompute, lo: int, hi: int, tokens: int) -> bool:
    checks = [(0, plan.first_row)] if lo == 0 else []
    if hi == tokens:
        checks.append((rows.shape[0] - 1, plan.last_row))
    for index, kept in checks:
        if kept is None:
            continue  # a stubbed linear head: position-wise by construction
        got = rows[index].double()
        want = kept.double()
        if float((got - want).norm()) > 1e-4 * float(want.norm()) + 1e-12:
            return False
    return True


# -- the run --------------------------------------------------------------------------------------


def layer_diff(
    model: InProcessModel,
    patches: Sequence[str],
    ids: Sequence[int],
    *,
    baseline: Sequence[str] = (),
    threshold: float = DEFAULT_THRESHOLD,
    decode_tokens: int = 0,
    dump: Path | None = None,
) -> LayerDiffResult:
    """Compare every module's output between ``baseline`` and ``baseline + patches`` on ``ids``.

    With ``decode_tokens = N`` the last N tokens are fed one at a time through the KV cache after
    a prefill of the rest (both phases are compared). ``dump`` writes each compared pair of
    tensors as a safetensors file there (and keeps full baseline outputs: more memory).
    """
    ids = [int(t) for t in ids]
    if len(ids) < 2:
        raise UsageError("layer diff needs at least 2 tokens", "pass a longer input (--tokens N)")
    if not 0 <= decode_tokens < len(ids):
        raise UsageError(
            f"--decode {decode_tokens} must be between 0 and the token count minus 1 ({len(ids) - 1})",
            "decode fewer tokens or pass a longer input",
        )
    if threshold <= 0:
        raise UsageError(f"threshold {threshold} must be positive", "pass e.g. --threshold 1e-8")
    if dump is not None:
        dump.mkdir(parents=True, exist_ok=True)
    wanted = tuple(dict.fromkeys([*baseline, *patches]))
    with model.patched(baseline):
        twin = shared_copy(model.model)
    edges = position_edges(len(ids))
    heads = stub_output_head(twin) if dump is None else {}
    pairing = Pairing(recompute=dump is None, heads=heads)
    collector = _Collector(pairing, edges, dump)
    with model.patched(wanted):
        handles = register(pairing, twin, model.model, collector)
        try:
            leftovers = _run_calls(model, twin, pairing, collector, ids, decode_tokens)
        finally:
            for handle in handles:
                handle.remove()
    return _result(
        model.name, tuple(patches), tuple(baseline), ids, decode_tokens, threshold, edges, collector, leftovers
    )


def _run_calls(
    model: InProcessModel, twin: nn.Module, pairing: Pairing, collector: _Collector, ids: list[int], decode: int
) -> list[Entry]:
    leftovers: list[Entry] = []
    if decode == 0:
        steps = [(0, ids)]
        caches: tuple[Any, Any] = (None, None)
    else:
        prefix = len(ids) - decode
        steps = [(0, ids[:prefix])] + [(prefix + i, [ids[prefix + i]]) for i in range(decode)]
        caches = (cast(Any, twin).new_cache(), model.new_cache())
    for offset, chunk in steps:
        batch = torch.tensor([chunk], dtype=torch.long)
        collector.last.clear()
        _paired_call(model, twin, pairing, offset, batch, caches)
        leftovers += pairing.leftovers()
    return leftovers


@torch.inference_mode()
def _paired_call(
    model: InProcessModel, twin: nn.Module, pairing: Pairing, offset: int, batch: Tensor, caches: tuple[Any, Any]
) -> None:
    def run_baseline() -> None:
        out = twin(batch, caches[0])
        del out  # the baseline's logits are never kept

    pairing.start_call(offset, batch.shape[1], run_baseline)
    try:
        out = model.model(batch, caches[1])
        del out
    except (SpeedtrapError, CompareError):
        pairing.stop()
        raise
    except Exception as exc:
        pairing.stop()
        where = pairing.stack[-1] if pairing.stack else "(model)"
        raise PatchError(
            f"the forward with patches {list(model.active)} failed in module {where!r}: {type(exc).__name__}: {exc}"[
                :400
            ],
            "fix or drop the patch that swaps this module",
        ) from exc
    pairing.finish_patched()
    if pairing.base_error is not None:
        failure = pairing.base_error
        raise TargetError(f"the baseline forward failed: {type(failure).__name__}: {failure}"[:400]) from failure


def _result(
    target: str,
    patches: tuple[str, ...],
    baseline: tuple[str, ...],
    ids: list[int],
    decode: int,
    threshold: float,
    edges: list[int],
    collector: _Collector,
    leftovers: list[Entry],
) -> LayerDiffResult:
    modules: list[ModuleDiff] = []
    for rec in sorted(collector.records.values(), key=lambda r: r.order):
        modules.append(module_diff(rec.name, rec.calls, rec.compared, rec.acc, rec.notes, bool(rec.mismatches)))
    seen = {m.name for m in modules}
    for entry in leftovers:
        if entry.name not in seen:
            seen.add(entry.name)
            modules.append(ModuleDiff(entry.name or "(model)", layer_of(entry.name), "baseline_only", 1, 0))
    return diff_result(target, patches, baseline, len(ids), decode, threshold, edges, modules)
