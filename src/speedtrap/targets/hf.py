"""``hf:`` targets: transformers models, so the localizer runs on real code, not only on smol-moe.

- ``hf:<model type>`` (``deepseek_v4``, ``deepseek_v3``, ``qwen3_moe``, ``mixtral``): the model
  transformers ships, built from a tiny config with seeded random weights (no hub, ~0.3 s).
- ``hf:<local directory>``: ``from_pretrained`` on a saved model (config + safetensors).
- ``hf:<file.gguf>``: transformers' GGUF loader (dequantized to float32).

Each is wrapped in :class:`HFCausalLM`, which speaks the localizer's interface:
``model(input_ids, cache=None) -> logits`` with a transformers ``DynamicCache`` that grows in place.
Decoding batches in lockstep (``speedtrap.targets._lockstep``: a forward per sequence, the weight GEMMs
shared, the same bits alone or together) unless :meth:`HFCausalLM.lockstep_safe` says it cannot.
These targets carry no built-in patches; user patches (``module:function``) are added at load.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor, nn

from speedtrap._errors import TargetError, UsageError
from speedtrap.patching import Patch, PatchInfo
from speedtrap.targets._base import InProcessModel

SEED = 0

_COMMON: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "initializer_range": 0.2,  # peaked next-token distributions, as a trained model has (0.05 gives near-uniform ones)
}

# Tiny configs: every MoE layer kind the model has, a few experts, float32 on CPU in milliseconds.
TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "deepseek_v4": _COMMON
    | {
        "num_key_value_heads": 1,
        "moe_intermediate_size": 32,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "head_dim": 32,
        "q_lora_rank": 32,
        "o_groups": 2,
        "o_lora_rank": 16,
        "index_n_heads": 2,
        "index_head_dim": 16,
        "index_topk": 8,
        "sliding_window": 16,
        "hc_sinkhorn_iters": 4,
        "mlp_layer_types": ["hash_moe", "hash_moe", "moe", "moe"],
        "routed_scaling_factor": 2.5,
    },
    "deepseek_v3": _COMMON
    | {
        "num_key_value_heads": 4,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "n_group": 2,
        "topk_group": 1,
        "q_lora_rank": None,
        "kv_lora_rank": 32,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 16,
        "v_head_dim": 16,
        "routed_scaling_factor": 2.5,
    },
    "qwen3_moe": _COMMON
    | {
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "head_dim": 16,
    },
    "mixtral": _COMMON | {"intermediate_size": 64, "num_local_experts": 4, "num_experts_per_tok": 2},
}


class HFCausalLM(nn.Module):
    """A transformers causal LM behind speedtrap's model interface (logits; a cache grown in place)."""

    def __init__(self, hf: nn.Module) -> None:
        super().__init__()
        self.hf = hf

    def forward(self, input_ids: Tensor, cache: Any = None) -> Tensor:
        out = self.hf(input_ids=input_ids, cache=cache, use_cache=cache is not None)
        return cast(Tensor, out.logits)

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        class Cache(DynamicCache):  # type: ignore[misc]
            """A DynamicCache with the ``copy()`` the engine's prefix cache takes of each entry."""

            def copy(self) -> Any:
                import copy

                return copy.deepcopy(self)

        return Cache(config=cast(Any, self.hf).config)

    def lockstep_safe(self) -> bool:
        """Whether sequences may decode in lockstep: not with a RoPE whose forward rebuilds its table for
        the sequence length at hand (``dynamic``, ``longrope``: state shared by every sequence)."""
        for module in self.hf.modules():
            kinds = getattr(module, "rope_type", None)
            names = kinds.values() if isinstance(kinds, dict) else [kinds]
            if any(isinstance(n, str) and ("dynamic" in n or "longrope" in n) for n in names):
                return False
        return True

    def patch_root(self) -> nn.Module:
        """What a user patch receives: the transformers model itself."""
        return self.hf


@dataclasses.dataclass
class HFTarget:
    """``hf:<model type | directory | file.gguf>``."""

    spec: str
    name: str = ""
    description: str = ""

    def __post_init__(self) -> None:
        self.name = f"hf:{self.spec}"
        if self.spec in TINY_CONFIGS:
            self.description = f"transformers {self.spec} from a tiny config with seeded random weights"
            return
        path = Path(self.spec).expanduser()
        if not path.exists():
            raise UsageError(
                f"hf target {self.spec!r} is neither a known model type nor an existing path",
                f"use hf:<{'|'.join(TINY_CONFIGS)}>, hf:<local model directory> or hf:<file.gguf>",
            )
        if path.is_file() and path.suffix != ".gguf":
            raise UsageError(f"hf target file {path} is not a .gguf file", "pass a model directory or a .gguf file")
        kind = "GGUF file" if path.is_file() else "local directory"
        self.description = f"transformers model from the {kind} {path}"

    def patch_infos(self) -> list[PatchInfo]:
        return []

    @property
    def chats(self) -> bool:
        """Tiny random-weight models have no tokenizer; saved models and GGUF files bring theirs."""
        return self.spec not in TINY_CONFIGS

    @property
    def source_dir(self) -> Path:
        """The transformers source of this model (what triage traces a factor through)."""
        import transformers

        models = Path(transformers.__file__).parent / "models"
        model_type = self.spec if self.spec in TINY_CONFIGS else _local_model_type(Path(self.spec).expanduser())
        folder = models / model_type if model_type else models
        return folder if folder.is_dir() else models

    def load(self, overrides: Mapping[str, str] | None = None, extra_patches: Sequence[Patch] = ()) -> InProcessModel:
        if self.spec in TINY_CONFIGS:
            hf, tokenizer = build_tiny(self.spec, overrides), None
        else:
            hf, tokenizer = _load_local(Path(self.spec).expanduser(), overrides)
        hf.eval().requires_grad_(False)
        catalog: list[Patch] = list(extra_patches)
        return InProcessModel(self.name, HFCausalLM(hf), tokenizer, catalog, _config_dict(hf.config))


def _local_model_type(path: Path) -> str | None:
    """``model_type`` of a saved model directory (None for a GGUF file or an unreadable config)."""
    import json

    try:
        return str(json.loads((path / "config.json").read_text(encoding="utf-8"))["model_type"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def build_tiny(model_type: str, overrides: Mapping[str, str] | None = None) -> nn.Module:
    """The transformers model of ``model_type`` from its tiny config, with seeded random weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = dict(TINY_CONFIGS[model_type])
    for key, raw in (overrides or {}).items():
        kwargs[key] = _parse(raw, kwargs.get(key), key)
    try:
        config = AutoConfig.for_model(model_type, **kwargs)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"bad config for {model_type}: {exc}"[:300], "check the --set overrides") from None
    config._attn_implementation = "eager"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = AutoModelForCausalLM.from_config(config).float()
        _fill_hash_tables(model, config)
    return cast(nn.Module, model)


def _fill_hash_tables(model: nn.Module, config: Any) -> None:
    """DeepSeek-V4's hash routers ship a zero token -> experts table; give each token distinct experts."""
    for module in model.modules():
        table = getattr(module, "tid2eid", None)
        if isinstance(table, Tensor):
            experts = int(getattr(config, "n_routed_experts", table.max().item() + 1))
            rows = torch.stack([torch.randperm(experts)[: table.shape[1]] for _ in range(table.shape[0])])
            table.copy_(rows.to(table.dtype))


def _load_local(path: Path, overrides: Mapping[str, str] | None) -> tuple[nn.Module, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if overrides:
        raise UsageError("config overrides apply to tiny hf:<model type> targets only", "drop --set")
    where, extra = (str(path.parent), {"gguf_file": path.name}) if path.is_file() else (str(path), {})
    try:
        model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, local_files_only=True, **extra)
    except Exception as exc:  # transformers raises many types for a bad directory or file
        raise TargetError(
            f"cannot load a transformers model from {path}: {type(exc).__name__}: {exc}"[:400],
            "pass a directory written by save_pretrained (config.json + weights) or a GGUF file transformers reads",
        ) from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, local_files_only=True, **extra)
    except Exception:  # a model without a tokenizer still runs on token ids
        tokenizer = None
    return cast(nn.Module, model), tokenizer


def _parse(raw: str, current: Any, key: str) -> Any:
    try:
        if isinstance(current, bool):
            return raw.strip().lower() in {"1", "true", "yes", "on"}
        if isinstance(current, int):
            return int(raw)
        if isinstance(current, float):
            return float(raw)
    except ValueError:
        raise UsageError(f"config value {raw!r} for {key!r} is not a {type(current).__name__}", None) from None
    try:
        return float(raw) if "." in raw or "e" in raw.lower() else int(raw)
    except ValueError:
        return raw


def _config_dict(config: Any) -> dict[str, Any]:
    data = config.to_dict() if hasattr(config, "to_dict") else dict(vars(config))
    return {k: v for k, v in data.items() if isinstance(v, (int, float, str, bool, list, dict, type(None)))}
