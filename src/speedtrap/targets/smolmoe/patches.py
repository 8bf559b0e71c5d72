"""smol-moe's eight speed patches, modelled on a real DeepSeek-V4 deployment's.

Each patch is a small object: static facts (:class:`PatchInfo`, with a unified diff against
``model.py`` showing the change as a source patch would) and an ``apply`` that swaps modules.
What each one does to recall and divergence is measured by the probes, never assumed here.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from speedtrap._errors import PatchError
from speedtrap.patching import Gate, Patch, PatchInfo, PatchKind, Phase, Undo
from speedtrap.targets.smolmoe.config import SmolMoEConfig
from speedtrap.targets.smolmoe.model import (
    KVCache,
    LayerCache,
    RMSNorm,
    RotaryEmbedding,
    SmolMoE,
    StepFn,
)

MODEL_FILE = "model.py"
BOTH = frozenset({Phase.PREFILL, Phase.DECODE})
ENV_PREFIX = "SPEEDTRAP_SMOLMOE_"


def env_gate(name: str) -> Gate:
    return Gate.env_var(ENV_PREFIX + name.upper())


@cache
def _model_source() -> str:
    return Path(__file__).with_name(MODEL_FILE).read_text()


def source_diff(replacements: tuple[tuple[str, str], ...]) -> str:
    """A unified diff of model.py with each ``old`` snippet replaced by its ``new`` one."""
    before = _model_source()
    after = before
    for old, new in replacements:
        if after.count(old) != 1:
            raise PatchError(f"diff snippet not found exactly once in {MODEL_FILE}: {old[:60]!r}")
        after = after.replace(old, new)
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{MODEL_FILE}", f"b/{MODEL_FILE}", n=3
    )
    return "".join(lines)


_IMPORT_OS = ("from __future__ import annotations\n\n", "from __future__ import annotations\n\nimport os\n")


def _env(name: str) -> str:
    return f'os.environ.get("{ENV_PREFIX}{name.upper()}") == "1"'


# ----------------------------------------------------------------------------------------------
# The modules the patches swap in.


class Bf16Linear(nn.Module):
    """The same Linear, computed as a bf16 GEMM and cast back."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = cast(nn.Linear, inner)

    def forward(self, x: Tensor) -> Tensor:
        bias = self.inner.bias.bfloat16() if self.inner.bias is not None else None
        return F.linear(x.bfloat16(), self.inner.weight.bfloat16(), bias).to(x.dtype)


class ScaledHashTopK(nn.Module):
    """HashTopK that also applies routed_scaling_factor to its output weights."""

    def __init__(self, inner: nn.Module, routed_scaling_factor: float) -> None:
        super().__init__()
        self.inner = inner
        self.routed_scaling_factor = routed_scaling_factor

    def forward(self, x: Tensor, input_ids: Tensor) -> tuple[Tensor, Tensor]:
        weights, indices = self.inner(x, input_ids)
        return weights * self.routed_scaling_factor, indices


class Fp8KVStore(nn.Module):
    """Keeps the KV cache in float8 e4m3 (scale 1.0); the current step attends to its own k/v unquantized."""

    def forward(self, k: Tensor, v: Tensor, cache: LayerCache | None) -> tuple[Tensor, Tensor]:
        if cache is None:
            return k, v
        if cache.k is not None and cache.v is not None:
            k = torch.cat([cache.k.to(k.dtype), k], dim=2)
            v = torch.cat([cache.v.to(v.dtype), v], dim=2)
        cache.k, cache.v = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
        return k, v


class FusedRMSNorm(nn.Module):
    """torch's fused rms_norm kernel with the same weight and eps."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = cast(RMSNorm, inner)

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.inner.weight, self.inner.eps)


class Bf16RopeCache(RotaryEmbedding):
    """The cos/sin tables stored in bf16."""

    def __init__(self, config: SmolMoEConfig) -> None:
        super().__init__(config)
        for name in ("cos_table", "sin_table"):
            self.register_buffer(name, cast(Tensor, getattr(self, name)).bfloat16(), persistent=False)


class ChunkedPrefill(nn.Module):
    """Prefills long inputs in chunks through the KV cache (as servers do to bound memory)."""

    def __init__(self, chunk_size: int, num_layers: int) -> None:
        super().__init__()
        self.chunk_size = chunk_size
        self.num_layers = num_layers

    def forward(self, step: StepFn, input_ids: Tensor, cache: KVCache | None) -> Tensor:
        if input_ids.shape[1] <= self.chunk_size:
            return step(input_ids, cache)
        work = cache if cache is not None else KVCache.empty(self.num_layers)
        chunks = input_ids.split(self.chunk_size, dim=1)
        return torch.cat([step(chunk, work) for chunk in chunks], dim=1)


class FusedSharedWeightExperts(nn.Module):
    """One GEMM for all experts: they share weights, so sum_k w_k * mlp(x) = (sum_k w_k) * mlp(x)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: Tensor, weights: Tensor, indices: Tensor) -> Tensor:
        mlp = cast(nn.Module, self.inner.mlp)
        out: Tensor = mlp(x) * weights.sum(-1, keepdim=True)
        return out


# ----------------------------------------------------------------------------------------------
# The patches.


@dataclass
class ModulePatch:
    """A patch described by its info; subclasses implement :meth:`swap`."""

    info: PatchInfo

    def apply(self, model: SmolMoE) -> Undo:
        if not isinstance(model, SmolMoE):
            raise PatchError(f"patch {self.info.name!r} is for smol-moe, not {type(model).__name__}")
        undo = Undo()
        self.swap(model, undo)
        return undo

    def swap(self, model: SmolMoE, undo: Undo) -> None:
        raise NotImplementedError


class MhcBf16Gemm(ModulePatch):
    def swap(self, model: SmolMoE, undo: Undo) -> None:
        for block in model.blocks():
            for hc in (block.attn_hc, block.mlp_hc):
                undo.swap(hc, "proj", Bf16Linear(hc.proj))


class HashTopKRoutedScaling(ModulePatch):
    def swap(self, model: SmolMoE, undo: Undo) -> None:
        for i in self.info.layers:
            moe = model.blocks()[i].mlp
            undo.swap(moe, "gate", ScaledHashTopK(moe.gate, moe.routed_scaling_factor))


class Fp8KvCache(ModulePatch):
    def swap(self, model: SmolMoE, undo: Undo) -> None:
        for block in model.blocks():
            undo.swap(block.attn, "kv_store", Fp8KVStore())


class FusedRmsnorm(ModulePatch):
    def swap(self, model: SmolMoE, undo: Undo) -> None:
        for block in model.blocks():
            undo.swap(block, "attn_norm", FusedRMSNorm(block.attn_norm))
            undo.swap(block, "mlp_norm", FusedRMSNorm(block.mlp_norm))
        undo.swap(model, "norm", FusedRMSNorm(model.norm))


class RopeCacheBf16(ModulePatch):
    def swap(self, model: SmolMoE, undo: Undo) -> None:
        undo.swap(model, "rope", Bf16RopeCache(model.config))


class LmHeadBf16(ModulePatch):
    def swap(self, model: SmolMoE, undo: Undo) -> None:
        undo.swap(model, "lm_head", Bf16Linear(_as_linear(cast(nn.Parameter, model.lm_head.weight))))


class ChunkedPrefillPatch(ModulePatch):
    chunk_size = 256

    def swap(self, model: SmolMoE, undo: Undo) -> None:
        undo.swap(model, "scheduler", ChunkedPrefill(self.chunk_size, model.config.num_layers))


class MoeFusedExperts(ModulePatch):
    def swap(self, model: SmolMoE, undo: Undo) -> None:
        for block in model.blocks():
            undo.swap(block.mlp, "experts", FusedSharedWeightExperts(block.mlp.experts))


class CombineWithoutRoutedScaling(ModulePatch):
    """Drops the factor from the combine of the hash layers (the other half of a correct pair)."""

    def swap(self, model: SmolMoE, undo: Undo) -> None:
        for i in self.info.layers:
            moe = model.blocks()[i].mlp
            undo.steps.append(partial(setattr, moe, "routed_scaling_factor", moe.routed_scaling_factor))
            moe.routed_scaling_factor = 1.0


def _as_linear(weight: nn.Parameter) -> nn.Linear:
    with torch.device("meta"):
        linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    linear.weight = weight
    return linear


def _info(
    name: str,
    summary: str,
    gate: Gate,
    kind: PatchKind,
    layers: range | tuple[int, ...],
    scope: str,
    phases: frozenset[Phase],
    replacements: tuple[tuple[str, str], ...],
) -> PatchInfo:
    return PatchInfo(name, summary, gate, kind, tuple(layers), scope, phases, source_diff(replacements), MODEL_FILE)


def build_patches(config: SmolMoEConfig | None = None) -> list[Patch]:
    """The eight patches, for a smol-moe with ``config`` (its layer count and hash layers)."""
    cfg = config or SmolMoEConfig()
    every = range(cfg.num_layers)
    hash_layers = range(cfg.num_hash_layers)
    hash_scope = f"layers 0-{cfg.num_hash_layers - 1} (hash-routed MoE)"
    return [
        MhcBf16Gemm(
            _info(
                "mhc_bf16_gemm",
                "Run the mHC mixing projection GEMM in bf16 instead of fp32.",
                env_gate("mhc_bf16_gemm"),
                PatchKind.PRECISION,
                every,
                "every layer (attn_hc and mlp_hc)",
                BOTH,
                (
                    _IMPORT_OS,
                    (
                        "        mixes = self.proj(flat)\n",
                        f"        if {_env('mhc_bf16_gemm')}:\n"
                        "            weight, bias = self.proj.weight.bfloat16(), self.proj.bias.bfloat16()\n"
                        "            mixes = F.linear(flat.bfloat16(), weight, bias).float()\n"
                        "        else:\n"
                        "            mixes = self.proj(flat)\n",
                    ),
                ),
            )
        ),
        HashTopKRoutedScaling(
            _info(
                "hash_topk_routed_scaling",
                "Let HashTopK apply routed_scaling_factor on its output weights (was: assert not implemented).",
                Gate.config_key("apply_routed_scaling_factor_on_output", "true"),
                PatchKind.SCALING,
                hash_layers,
                hash_scope,
                BOTH,
                (
                    (
                        '        assert not apply_routed_scaling_factor_on_output, "not implemented"\n',
                        "        self.apply_routed_scaling_factor_on_output = apply_routed_scaling_factor_on_output\n"
                        "        self.routed_scaling_factor = config.routed_scaling_factor\n",
                    ),
                    (
                        "        weights = scores.gather(-1, indices)\n"
                        "        return weights / weights.sum(-1, keepdim=True), indices\n",
                        "        weights = scores.gather(-1, indices)\n"
                        "        weights = weights / weights.sum(-1, keepdim=True)\n"
                        "        if self.apply_routed_scaling_factor_on_output:\n"
                        "            weights = weights * self.routed_scaling_factor\n"
                        "        return weights, indices\n",
                    ),
                    (
                        "HashTopK(config) if is_hash",
                        "HashTopK(config, config.apply_routed_scaling_factor_on_output) if is_hash",
                    ),
                ),
            )
        ),
        Fp8KvCache(
            _info(
                "fp8_kv_cache",
                "Store the KV cache in float8 e4m3 (scale 1.0) to halve cache memory.",
                env_gate("fp8_kv_cache"),
                PatchKind.CACHE,
                every,
                "every layer (attention KV cache)",
                frozenset({Phase.DECODE}),
                (
                    _IMPORT_OS,
                    (
                        "            k = torch.cat([cache.k, k], dim=2)\n"
                        "            v = torch.cat([cache.v, v], dim=2)\n"
                        "        cache.k, cache.v = k, v\n",
                        "            k = torch.cat([cache.k.to(k.dtype), k], dim=2)\n"
                        "            v = torch.cat([cache.v.to(v.dtype), v], dim=2)\n"
                        f"        if {_env('fp8_kv_cache')}:\n"
                        "            cache.k, cache.v = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)\n"
                        "        else:\n"
                        "            cache.k, cache.v = k, v\n",
                    ),
                ),
            )
        ),
        FusedRmsnorm(
            _info(
                "fused_rmsnorm",
                "Use the fused rms_norm kernel for every RMSNorm (same math).",
                env_gate("fused_rmsnorm"),
                PatchKind.KERNEL,
                every,
                "every layer (attn_norm, mlp_norm) and the final norm",
                BOTH,
                (
                    _IMPORT_OS,
                    (
                        "        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight\n",
                        f"        if {_env('fused_rmsnorm')}:\n"
                        "            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)\n"
                        "        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight\n",
                    ),
                ),
            )
        ),
        RopeCacheBf16(
            _info(
                "rope_cache_bf16",
                "Keep the RoPE cos/sin cache in bf16 to save memory bandwidth.",
                env_gate("rope_cache_bf16"),
                PatchKind.PRECISION,
                every,
                "every layer (q and k rotation)",
                BOTH,
                (
                    _IMPORT_OS,
                    (
                        '        self.register_buffer("cos_table", angles.cos().float(), persistent=False)\n'
                        '        self.register_buffer("sin_table", angles.sin().float(), persistent=False)\n',
                        f"        table_dtype = torch.bfloat16 if {_env('rope_cache_bf16')} else torch.float32\n"
                        '        self.register_buffer("cos_table", angles.cos().to(table_dtype), persistent=False)\n'
                        '        self.register_buffer("sin_table", angles.sin().to(table_dtype), persistent=False)\n',
                    ),
                ),
            )
        ),
        LmHeadBf16(
            _info(
                "lm_head_bf16",
                "Compute the lm_head GEMM in bf16.",
                env_gate("lm_head_bf16"),
                PatchKind.PRECISION,
                (),
                "lm_head (after the last layer)",
                BOTH,
                (
                    _IMPORT_OS,
                    (
                        "        return F.linear(x, self.weight)\n",
                        f"        if {_env('lm_head_bf16')}:\n"
                        "            return F.linear(x.bfloat16(), self.weight.bfloat16()).float()\n"
                        "        return F.linear(x, self.weight)\n",
                    ),
                ),
            )
        ),
        ChunkedPrefillPatch(
            _info(
                "chunked_prefill",
                "Prefill long prompts in chunks of 256 tokens through the KV cache.",
                env_gate("chunked_prefill"),
                PatchKind.SCHEDULING,
                every,
                "every layer (prefill schedule)",
                frozenset({Phase.PREFILL}),
                (
                    _IMPORT_OS,
                    (
                        "        self.scheduler: nn.Module = OneShotPrefill()\n",
                        "        self.scheduler: nn.Module = (\n"
                        f"            ChunkedPrefill(256, config.num_layers)\n"
                        f"            if {_env('chunked_prefill')}\n"
                        "            else OneShotPrefill()\n"
                        "        )\n",
                    ),
                ),
            )
        ),
        MoeFusedExperts(
            _info(
                "moe_fused_experts",
                "Replace the per-expert dispatch loop by one fused GEMM (experts share weights; same math).",
                env_gate("moe_fused_experts"),
                PatchKind.KERNEL,
                every,
                "every layer (MoE experts)",
                BOTH,
                (
                    _IMPORT_OS,
                    (
                        "        flat_x = x.reshape(-1, x.shape[-1])\n",
                        f"        if {_env('moe_fused_experts')}:\n"
                        "            return self.mlp(x) * weights.sum(-1, keepdim=True)\n"
                        "        flat_x = x.reshape(-1, x.shape[-1])\n",
                    ),
                ),
            )
        ),
    ]


def build_extra_patches(config: SmolMoEConfig | None = None) -> list[Patch]:
    """Patches outside the eight, for constructed cases (the correct-only-together pair)."""
    cfg = config or SmolMoEConfig()
    return [
        CombineWithoutRoutedScaling(
            _info(
                "combine_without_routed_scaling",
                "Drop routed_scaling_factor from the MoE combine of the hash layers (HashTopK applies it).",
                env_gate("combine_without_routed_scaling"),
                PatchKind.SCALING,
                range(cfg.num_hash_layers),
                f"layers 0-{cfg.num_hash_layers - 1} (hash-routed MoE)",
                BOTH,
                (
                    (
                        "        return routed * self.routed_scaling_factor + self.shared_expert(x)\n",
                        "        if self.skip_routed_scaling:\n"
                        "            return routed + self.shared_expert(x)\n"
                        "        return routed * self.routed_scaling_factor + self.shared_expert(x)\n",
                    ),
                ),
            )
        ),
    ]
