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
- ``SPEEDTRAP_VLLM_PREFILL_MLP_SCALE=<factor>`` (the constructed prefill-path bug of the prefill/decode
  example, examples/vllm-pd): in decoder layers 1-4 the MLP's output is multiplied by the factor, but only
  in forward passes of more than ``PREFILL_MIN_TOKENS`` tokens (a "prefill kernel" path). On a prefill
  role it changes the prompt's KV, which the decode then reads; a decode role only runs passes of one
  token per sequence plus the prompt's last partial KV block (under 64 tokens), so there it does nothing.

Registering twice in one process (vLLM may call it more than once) installs nothing twice.
"""

from __future__ import annotations

import os
import sys
from typing import Any

DOUBLE_NORM_GAIN = "SPEEDTRAP_VLLM_DOUBLE_NORM_GAIN"
SILU_NATIVE = "SPEEDTRAP_VLLM_SILU_NATIVE"
RMSNORM_NATIVE = "SPEEDTRAP_VLLM_RMSNORM_NATIVE"
PREFILL_MLP_SCALE = "SPEEDTRAP_VLLM_PREFILL_MLP_SCALE"
DOUBLE_GAIN_LAYERS = (2, 3, 4)
PREFILL_SCALE_LAYERS = (1, 2, 3, 4)
PREFILL_MIN_TOKENS = 64
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


def _prefill_mlp_scale(factor: float) -> None:
    from vllm.model_executor.models import llama
    from vllm.model_executor.models.utils import extract_layer_index

    original_init = llama.LlamaDecoderLayer.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        prefix = kwargs.get("prefix", args[1] if len(args) > 1 else "")
        if extract_layer_index(prefix) not in PREFILL_SCALE_LAYERS:
            return
        mlp_forward = self.mlp.forward

        def forward(x: Any) -> Any:
            out = mlp_forward(x)
            return out * factor if x.shape[0] > PREFILL_MIN_TOKENS else out  # the prefill path only

        self.mlp.forward = forward

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
    scale = os.environ.get(PREFILL_MLP_SCALE, "").strip()
    if scale and PREFILL_MLP_SCALE not in _DONE:
        _prefill_mlp_scale(float(scale))
        _DONE.add(PREFILL_MLP_SCALE)
        on.append(f"{PREFILL_MLP_SCALE}={scale}")
    if on:
        print(f"speedtrap_example[{os.getpid()}]: patches installed: {', '.join(on)}", file=sys.stderr, flush=True)
