"""Three out-of-tree patches to vLLM's Llama, each switched by an environment variable.

vLLM calls :func:`register` in every process it starts (``vllm.general_plugins``, selected with
``VLLM_PLUGINS=speedtrap_example``). The patches are installed on the model classes before the
model is built, the way deployments carry out-of-tree kernels and fixes:

- ``SPEEDTRAP_VLLM_DOUBLE_NORM_GAIN=1`` (the constructed bug): in decoder layers 2, 3 and 4 the
  MLP's input is multiplied by ``post_attention_layernorm.weight`` once more, so the RMSNorm gain
  is applied twice in those layers (a "fused norm + MLP" path that forgot the norm had already
  scaled its output).
- ``SPEEDTRAP_VLLM_SILU_NATIVE=1`` (harmless): the MLP's SiLU-and-multiply computed with plain
  torch ops instead of vLLM's kernel; the same function up to float rounding.
- ``SPEEDTRAP_VLLM_RMSNORM_NATIVE=1`` (harmless): every RMSNorm through its torch-native path
  instead of the CPU kernel; the same function up to float rounding.

Registering twice in one process (vLLM may call it more than once) installs nothing twice.
"""

from __future__ import annotations

import os
import sys
from typing import Any

DOUBLE_NORM_GAIN = "SPEEDTRAP_VLLM_DOUBLE_NORM_GAIN"
SILU_NATIVE = "SPEEDTRAP_VLLM_SILU_NATIVE"
RMSNORM_NATIVE = "SPEEDTRAP_VLLM_RMSNORM_NATIVE"
DOUBLE_GAIN_LAYERS = (2, 3, 4)
_TRUTHY = {"1", "true", "yes", "on"}
_DONE: set[str] = set()  # patches installed in this process (register may run more than once)


def _on(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUTHY


def _double_norm_gain() -> None:
    from vllm.model_executor.models import llama
    from vllm.model_executor.models.utils import extract_layer_index

    original_init = llama.LlamaDecoderLayer.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        prefix = kwargs.get("prefix", args[1] if len(args) > 1 else "")
        if extract_layer_index(prefix) not in DOUBLE_GAIN_LAYERS:
            return
        mlp, gain = self.mlp, self.post_attention_layernorm.weight
        mlp_forward = mlp.forward

        def forward(x: Any) -> Any:
            return mlp_forward(x * gain)  # the norm's gain, applied a second time

        mlp.forward = forward

    llama.LlamaDecoderLayer.__init__ = __init__


def _silu_native() -> None:
    import torch
    from vllm.model_executor.models import llama

    class TorchSiluAndMul(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            d = x.shape[-1] // 2
            return torch.nn.functional.silu(x[..., :d]) * x[..., d:]

    original_init = llama.LlamaMLP.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self.act_fn = TorchSiluAndMul()

    llama.LlamaMLP.__init__ = __init__


def _rmsnorm_native() -> None:
    from vllm.model_executor.layers.layernorm import RMSNorm

    RMSNorm.forward = RMSNorm.forward_native


PATCHES = {DOUBLE_NORM_GAIN: _double_norm_gain, SILU_NATIVE: _silu_native, RMSNORM_NATIVE: _rmsnorm_native}


def register() -> None:
    """vLLM's entry point: install the patches whose variable is on; say which, in the server log."""
    on = [name for name in PATCHES if _on(name) and name not in _DONE]
    for name in on:
        PATCHES[name]()
        _DONE.add(name)
    if on:
        print(f"speedtrap_example[{os.getpid()}]: patches installed: {', '.join(on)}", file=sys.stderr, flush=True)
