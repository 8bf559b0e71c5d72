"""A layer diff's result from its per-module sums: shared by the in-process and the live comparison."""

from __future__ import annotations

from collections.abc import Sequence

from speedtrap._shapes import LayerGrowth
from speedtrap.localize._results import LayerDiffResult, ModuleDiff, layer_of, layer_prefix
from speedtrap.localize._stats import Accumulator


def module_diff(
    name: str, calls: int, compared: int, acc: Accumulator, notes: Sequence[str], mismatched: bool
) -> ModuleDiff:
    """One module's row: its statistics when any call was compared, else why not."""
    display = name or "(model)"
    note = "; ".join(notes)
    if compared:
        return ModuleDiff(
            display, layer_of(name), "compared", calls, compared, acc.rel_diff, acc.max_abs, acc.cosine,
            tuple(acc.bucket_rel()), note,
        )  # fmt: skip
    return ModuleDiff(display, layer_of(name), "mismatch" if mismatched else "patched_only", calls, 0, note=note)


def diff_result(
    target: str,
    patches: tuple[str, ...],
    baseline: tuple[str, ...],
    tokens: int,
    decode: int,
    threshold: float,
    edges: Sequence[int],
    modules: list[ModuleDiff],
) -> LayerDiffResult:
    """The result over ``modules`` (execution order): the first over ``threshold``, growth by layer."""
    first = next((m.name for m in modules if m.diverged(threshold)), None)
    return LayerDiffResult(
        target, patches, baseline, tokens, decode, threshold, tuple(edges), tuple(modules), first, growth(modules)
    )


def growth(modules: list[ModuleDiff]) -> tuple[LayerGrowth, ...]:
    by_layer: dict[int, list[ModuleDiff]] = {}
    for m in modules:
        if m.layer is not None and m.rel_diff is not None:
            by_layer.setdefault(m.layer, []).append(m)
    out = []
    for layer in sorted(by_layer):
        members = by_layer[layer]
        block = next((m for m in members if layer_prefix(m.name) == m.name), None)
        worst = max(members, key=lambda m: m.rel_diff or 0.0)
        module = block or worst
        out.append(LayerGrowth(layer, module.name, module.rel_diff, float(worst.rel_diff or 0.0)))
    return tuple(out)
