"""Localize: where the numbers first go wrong, and how many times a scale factor is applied.

from speedtrap.localize import layer_diff, check_scale
diff = layer_diff(model, ["mhc_bf16_gemm"], ids)          # first divergent module, growth
scale = check_scale(model, "routed_scaling_factor", ids)  # 0 / 1 / 2 applications per MoE layer
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from speedtrap._lazy import lazy_getattr
from speedtrap._shapes import LayerGrowth
from speedtrap.localize._results import (
    ConsumerFit,
    LayerDiffResult,
    ModuleDiff,
    PinnedSite,
    ScaleCheckResult,
    ScaleUnit,
)

if TYPE_CHECKING:
    from speedtrap.localize._inputs import default_ids
    from speedtrap.localize._layers import DEFAULT_THRESHOLD, layer_diff, shared_copy
    from speedtrap.localize._scale import DEFAULT_PARAM, check_scale

__all__ = [
    "DEFAULT_PARAM",
    "DEFAULT_THRESHOLD",
    "ConsumerFit",
    "LayerDiffResult",
    "LayerGrowth",
    "ModuleDiff",
    "PinnedSite",
    "ScaleCheckResult",
    "ScaleUnit",
    "check_scale",
    "default_ids",
    "layer_diff",
    "shared_copy",
]

# The rest loads on first use, so that reading the result types loads no stage machinery.
_LAZY = {
    "DEFAULT_PARAM": "speedtrap.localize._scale",
    "DEFAULT_THRESHOLD": "speedtrap.localize._layers",
    "check_scale": "speedtrap.localize._scale",
    "default_ids": "speedtrap.localize._inputs",
    "layer_diff": "speedtrap.localize._layers",
    "shared_copy": "speedtrap.localize._layers",
}


__getattr__ = lazy_getattr(__name__, _LAZY)
