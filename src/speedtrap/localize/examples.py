"""Example user patches for ``--patches module:function`` (MoE models holding routed_scaling_factor).

    speedtrap check scale --target hf:deepseek_v4 --patches speedtrap.localize.examples:apply_factor_again

Each function takes the model and returns an :class:`Undo`; the ``layers`` argument (not given
on the command line: every MoE layer) limits the patch to some layer indices.
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from typing import Any

from torch import nn

from speedtrap.localize._results import layer_of
from speedtrap.patching import Undo

PARAM = "routed_scaling_factor"


class ScaleRoutedOutput(nn.Module):
    """The experts' (routed) output multiplied by ``routed_scaling_factor`` once more."""

    def __init__(self, inner: nn.Module, routed_scaling_factor: float) -> None:
        super().__init__()
        self.inner = inner
        self.routed_scaling_factor = routed_scaling_factor

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = self.inner(*args, **kwargs)
        return out * self.routed_scaling_factor


def moe_blocks(model: nn.Module, layers: Collection[int] | None = None) -> list[tuple[str, nn.Module, float]]:
    """(name, block, factor) of each MoE block: a module with an ``experts`` child whose gate or
    itself holds ``routed_scaling_factor``."""
    found = []
    for name, module in model.named_modules():
        children = dict(module.named_children())
        if "experts" not in children:
            continue
        holder = next((m for m in (module, children.get("gate")) if m is not None and PARAM in vars(m)), None)
        if holder is None:
            continue
        layer = layer_of(name)
        if layers is None or layer in layers:
            found.append((name, module, float(vars(holder)[PARAM])))
    return found


def apply_factor_again(model: nn.Module, layers: Collection[int] | None = None) -> Undo:
    """Multiply each MoE block's routed output by routed_scaling_factor again (a double application)."""
    undo = Undo()
    for _, block, factor in moe_blocks(model, layers):
        undo.swap(block, "experts", ScaleRoutedOutput(block.get_submodule("experts"), factor))
    return undo


apply_factor_again.speedtrap_kind = "scaling"  # type: ignore[attr-defined]


def drop_factor(model: nn.Module, layers: Collection[int] | None = None) -> Undo:
    """Pin routed_scaling_factor to 1.0 wherever an MoE block applies it (the factor is lost)."""
    undo = Undo()
    for _, block, _ in moe_blocks(model, layers):
        for holder in (block, getattr(block, "gate", None)):
            if holder is not None and PARAM in vars(holder):
                undo.steps.append(functools.partial(setattr, holder, PARAM, vars(holder)[PARAM]))
                setattr(holder, PARAM, 1.0)
    return undo


drop_factor.speedtrap_kind = "scaling"  # type: ignore[attr-defined]
