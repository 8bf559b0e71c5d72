"""Dense SmolLM2 weights -> smol-moe, computing the same function.

- MLP: a seeded permutation splits the dense MLP's neurons into the routed experts' slice
  (``routed_fraction``) and the shared expert's; the routed down projection is divided by
  ``routed_scaling_factor``, which the combine multiplies back exactly once.
- Routers: seeded random gate weights (they choose and weight experts that share one weight set,
  so any renormalized weights give the dense output) and a seeded token-id -> experts table.
- Hyper-connections: a seeded random projection for ``pre`` and ``comb`` (real work), zero rows
  for ``post`` so that ``post = 2 * sigmoid(0) = 1``; identical streams then stay identical.
"""

from __future__ import annotations

import torch
from torch import Tensor

from speedtrap.targets.smolmoe.config import SmolMoEConfig
from speedtrap.targets.smolmoe.model import LMHead, RotaryEmbedding, SmolMoE


def config_from_hf(hf: dict[str, object], **overrides: object) -> SmolMoEConfig:
    def num(key: str) -> float:
        value = hf[key]
        assert isinstance(value, int | float), key
        return value

    base = SmolMoEConfig(
        vocab_size=int(num("vocab_size")),
        hidden_size=int(num("hidden_size")),
        intermediate_size=int(num("intermediate_size")),
        num_layers=int(num("num_hidden_layers")),
        num_heads=int(num("num_attention_heads")),
        num_kv_heads=int(num("num_key_value_heads")),
        rope_theta=float(_rope_theta(hf)),
        rms_norm_eps=float(num("rms_norm_eps")),
    )
    return base.with_overrides(dict(overrides)) if overrides else base  # type: ignore[arg-type]


def _rope_theta(hf: dict[str, object]) -> float:
    params = hf.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    theta = hf.get("rope_theta", 10000.0)
    assert isinstance(theta, int | float)
    return float(theta)


def smol_moe_state(dense: dict[str, Tensor], config: SmolMoEConfig) -> dict[str, Tensor]:
    """The state dict of :class:`SmolMoE` built from a dense Llama state dict."""
    gen = torch.Generator().manual_seed(config.seed)
    d, n = config.hidden_size, config.hc_mult
    state: dict[str, Tensor] = {
        "embed.weight": dense["model.embed_tokens.weight"],
        "norm.weight": dense["model.norm.weight"],
        "head_hc.proj.weight": torch.randn(n, n * d, generator=gen) / (n * d) ** 0.5,
        "head_hc.proj.bias": torch.zeros(n),
    }
    state["lm_head.weight"] = state["embed.weight"]
    for i in range(config.num_layers):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            state[f"{dst}attn.{name}.weight"] = dense[f"{src}self_attn.{name}.weight"]
        state[f"{dst}attn_norm.weight"] = dense[f"{src}input_layernorm.weight"]
        state[f"{dst}mlp_norm.weight"] = dense[f"{src}post_attention_layernorm.weight"]
        for hc in ("attn_hc", "mlp_hc"):
            state.update(_hyper_connection(f"{dst}{hc}.", config, gen))
        state.update(_moe(f"{dst}mlp.", src, dense, config, i, gen))
    return state


def _hyper_connection(prefix: str, config: SmolMoEConfig, gen: torch.Generator) -> dict[str, Tensor]:
    n, d = config.hc_mult, config.hidden_size
    weight = torch.randn((2 + n) * n, n * d, generator=gen) / (n * d) ** 0.5
    weight[n : 2 * n] = 0.0  # post = 2 * sigmoid(0) = 1
    bias = torch.zeros((2 + n) * n)
    bias[2 * n :] = (2.0 * torch.eye(n)).flatten()  # comb leans to identity, as mHC initializes
    return {f"{prefix}proj.weight": weight, f"{prefix}proj.bias": bias, f"{prefix}scale": torch.ones(3)}


def _moe(
    prefix: str, src: str, dense: dict[str, Tensor], config: SmolMoEConfig, layer: int, gen: torch.Generator
) -> dict[str, Tensor]:
    gate = dense[f"{src}mlp.gate_proj.weight"]
    up = dense[f"{src}mlp.up_proj.weight"]
    down = dense[f"{src}mlp.down_proj.weight"]
    perm = torch.randperm(config.intermediate_size, generator=gen)
    routed, shared = perm[: config.routed_neurons].sort().values, perm[config.routed_neurons :].sort().values
    rsf = config.routed_scaling_factor
    out = {
        f"{prefix}experts.mlp.gate_proj.weight": gate[routed].contiguous(),
        f"{prefix}experts.mlp.up_proj.weight": up[routed].contiguous(),
        f"{prefix}experts.mlp.down_proj.weight": (down[:, routed] / rsf).contiguous(),
        f"{prefix}shared_expert.gate_proj.weight": gate[shared].contiguous(),
        f"{prefix}shared_expert.up_proj.weight": up[shared].contiguous(),
        f"{prefix}shared_expert.down_proj.weight": down[:, shared].contiguous(),
        f"{prefix}gate.weight": torch.randn(config.num_experts, config.hidden_size, generator=gen),
    }
    if layer < config.num_hash_layers:
        table = torch.rand(config.vocab_size, config.num_experts, generator=gen).argsort(-1)
        out[f"{prefix}gate.tid2eid"] = table[:, : config.top_k].contiguous()
    return out


def build_smol_moe(dense: dict[str, Tensor], config: SmolMoEConfig) -> SmolMoE:
    """A SmolMoE in eval mode with the converted weights (no random init is spent)."""
    with torch.device("meta"):
        model = SmolMoE(config)
    model.load_state_dict(smol_moe_state(dense, config), assign=True, strict=True)
    model.lm_head = LMHead(model.embed.weight)
    model.rope = RotaryEmbedding(config)
    return model.eval().requires_grad_(False)
