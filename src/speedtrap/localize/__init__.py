"""Localize: where the numbers first go wrong, and how many times a scale factor is applied.

from speedtrap.localize import layer_diff, check_scale
diff = layer_diff(model, ["mhc_bf16_gemm"], ids)          # first divergent module, growth
scale = check_scale(model, "routed_scaling_factor", ids)  # 0 / 1 / 2 applications per MoE layer
scale.units[0].applying                                   # where: the sites that apply it (file:line)

Inside a live server (SGLang, vLLM, ``speedtrap serve``): launch it with ``agent_env(folder)`` added
to its environment, then ``capture_live`` / ``compare_captures`` / ``scale_live`` (see ``_live.py``);
on a manifest's stack, ``localize_on_stack`` launches the base and a culprit one at a time and does it all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from speedtrap._lazy import lazy_getattr
from speedtrap._shapes import LayerGrowth
from speedtrap.localize._results import (
    ConsumerFit,
    FactorSite,
    LayerDiffResult,
    ModuleDiff,
    PinnedSite,
    ScaleCheckResult,
    ScaleUnit,
    scale_words,
)

if TYPE_CHECKING:
    from speedtrap.localize._agentlink import AGENT_PATH, AgentLink, agent_env
    from speedtrap.localize._capture import Capture, ModuleRows, Noise, load_capture, parse_capture, save_capture
    from speedtrap.localize._dumper import dumper_env, parse_dump_name
    from speedtrap.localize._inputs import default_ids, folder_ids
    from speedtrap.localize._layers import DEFAULT_THRESHOLD, layer_diff, shared_copy
    from speedtrap.localize._live import capture_live, scale_live
    from speedtrap.localize._livediff import NOISE_MARGIN, compare_captures
    from speedtrap.localize._on_stack import (
        LiveRequest,
        RoleResult,
        StackLocalization,
        localize_manifest,
        localize_on_stack,
    )
    from speedtrap.localize._scale import DEFAULT_PARAM, check_scale

__all__ = [
    "AGENT_PATH",
    "DEFAULT_PARAM",
    "DEFAULT_THRESHOLD",
    "NOISE_MARGIN",
    "AgentLink",
    "Capture",
    "ConsumerFit",
    "FactorSite",
    "LayerDiffResult",
    "LayerGrowth",
    "LiveRequest",
    "ModuleDiff",
    "ModuleRows",
    "Noise",
    "PinnedSite",
    "RoleResult",
    "ScaleCheckResult",
    "ScaleUnit",
    "StackLocalization",
    "agent_env",
    "capture_live",
    "check_scale",
    "compare_captures",
    "default_ids",
    "dumper_env",
    "folder_ids",
    "layer_diff",
    "load_capture",
    "localize_manifest",
    "localize_on_stack",
    "parse_capture",
    "parse_dump_name",
    "save_capture",
    "scale_live",
    "scale_words",
    "shared_copy",
]

# The rest loads on first use, so that reading the result types loads no stage machinery.
_LAZY = {
    "localize_manifest": "speedtrap.localize._on_stack",
    "folder_ids": "speedtrap.localize._inputs",
    "LiveRequest": "speedtrap.localize._on_stack",
    "RoleResult": "speedtrap.localize._on_stack",
    "StackLocalization": "speedtrap.localize._on_stack",
    "localize_on_stack": "speedtrap.localize._on_stack",
    "AGENT_PATH": "speedtrap.localize._agentlink",
    "AgentLink": "speedtrap.localize._agentlink",
    "agent_env": "speedtrap.localize._agentlink",
    "Capture": "speedtrap.localize._capture",
    "ModuleRows": "speedtrap.localize._capture",
    "Noise": "speedtrap.localize._capture",
    "load_capture": "speedtrap.localize._capture",
    "parse_capture": "speedtrap.localize._capture",
    "save_capture": "speedtrap.localize._capture",
    "dumper_env": "speedtrap.localize._dumper",
    "parse_dump_name": "speedtrap.localize._dumper",
    "capture_live": "speedtrap.localize._live",
    "scale_live": "speedtrap.localize._live",
    "NOISE_MARGIN": "speedtrap.localize._livediff",
    "compare_captures": "speedtrap.localize._livediff",
    "DEFAULT_PARAM": "speedtrap.localize._scale",
    "DEFAULT_THRESHOLD": "speedtrap.localize._layers",
    "check_scale": "speedtrap.localize._scale",
    "default_ids": "speedtrap.localize._inputs",
    "layer_diff": "speedtrap.localize._layers",
    "shared_copy": "speedtrap.localize._layers",
}


__getattr__ = lazy_getattr(__name__, _LAZY)
