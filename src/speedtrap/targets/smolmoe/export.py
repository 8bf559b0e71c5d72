"""``speedtrap export``: the dense model smol-moe is built from, as a Hugging Face folder.

``--format hf``:
SmolLM2-135M-Instruct's weights as read from the GGUF file (dequantized, float32), saved as
``LlamaForCausalLM`` safetensors with its config, tokenizer and chat template, so that any server
(vLLM, SGLang, transformers) can serve the model speedtrap embeds. The folder is written atomically:
a crash leaves no half-written export.

``--format glm4-moe``: the same function as a ``Glm4MoeForCausalLM`` (GLM-4.5's layout, which SGLang's
``glm4_moe.py`` serves with the seed's ``TopK(apply_routed_scaling_factor_on_output=...)``): the last
``num_hash_layers`` layers are MoE, each with smol-moe's own split of that layer's dense MLP: the routed
experts (8, identical) hold smol-moe's routed neurons with the down projection divided by
``routed_scaling_factor``, the shared experts hold the rest (padded with zero neurons to a whole number of
experts: a zero neuron adds exactly nothing). Sigmoid routing with a zero correction bias, one group,
normalized top-2: identical experts under weights summing to one, times the factor once, give the dense
MLP back. A patch that applies the factor twice makes those layers' routed part ``factor`` times too big,
as smol-moe's seed bug does in its hash layers. Attention stays Llama's (full rotary, no bias, no qk-norm).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from speedtrap._errors import UsageError
from speedtrap.targets.smolmoe.weights import DenseWeights

FORMATS = ("hf", "glm4-moe")
# Keys of transformers' config that describe how it was read (from a GGUF file, by this process) or
# that a causal LM does not use; a server reading ``quantization_config`` would expect GGUF weights.
_DROP = {
    "_name_or_path", "_model_name_or_path", "transformers_version", "_commit_hash", "torch_dtype", "dtype",
    "architectures", "quantization_config", "id2label", "label2id", "problem_type", "output_hidden_states",
    "output_attentions", "return_dict", "chunk_size_feed_forward", "is_encoder_decoder",
}  # fmt: skip


@dataclass(frozen=True)
class ExportResult:
    out: Path
    format: str
    files: tuple[str, ...]
    parameters: int
    source: str
    source_sha256: str

    def to_json(self) -> dict[str, Any]:
        return {
            "out": str(self.out),
            "format": self.format,
            "files": list(self.files),
            "parameters": self.parameters,
            "source": self.source,
            "source_sha256": self.source_sha256,
        }


def hf_config(dense: DenseWeights) -> dict[str, Any]:
    """The dense model's config.json: LlamaForCausalLM in float32, tied embeddings."""
    config = {k: v for k, v in dense.hf_config.items() if k not in _DROP}
    config.update(architectures=["LlamaForCausalLM"], model_type="llama", torch_dtype="float32")
    config["tie_word_embeddings"] = True
    return config


def glm4_moe_config(dense: DenseWeights, moe_layers: int, experts: int, top_k: int, moe_size: int,
                    shared: int, factor: float) -> dict[str, Any]:  # fmt: skip
    """config.json of the GLM-4-MoE export: the dense model's sizes, GLM-4.5's MoE keys."""
    base = hf_config(dense)
    layers = int(base["num_hidden_layers"])
    theta = float(base.get("rope_theta") or (base.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "bos_token_id", "eos_token_id",
            "pad_token_id", "hidden_act", "initializer_range")  # fmt: skip
    config = {k: base[k] for k in keep if k in base}
    config.update(
        architectures=["Glm4MoeForCausalLM"], model_type="glm4_moe", torch_dtype="float32",
        head_dim=int(base["hidden_size"]) // int(base["num_attention_heads"]), partial_rotary_factor=1.0,
        rope_theta=theta, rope_parameters={"rope_type": "default", "rope_theta": theta,
                                           "partial_rotary_factor": 1.0},
        attention_bias=False, use_qk_norm=False, tie_word_embeddings=False, hidden_act="silu",
        first_k_dense_replace=layers - moe_layers, n_routed_experts=experts, num_experts_per_tok=top_k,
        moe_intermediate_size=moe_size, n_shared_experts=shared, n_group=1, topk_group=1,
        norm_topk_prob=True, routed_scaling_factor=factor, num_nextn_predict_layers=0,
    )  # fmt: skip
    return config


def glm4_moe_state(dense: DenseWeights) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The GLM-4-MoE export's tensors (named as GLM-4.5's checkpoints) and config, from smol-moe's split."""
    from speedtrap.targets.smolmoe.convert import config_from_hf, smol_moe_state

    smol = config_from_hf(dense.hf_config)
    split = smol_moe_state(dense.state, smol)  # smol-moe's own routed/shared neurons and gates
    size = smol.routed_neurons
    shared_real = smol.intermediate_size - size
    shared = -(-shared_real // size)  # whole experts; the padding neurons are zero
    pad = shared * size - shared_real
    first_moe = smol.num_layers - smol.num_hash_layers
    state = {k: v for k, v in dense.state.items() if ".mlp." not in k}
    state["lm_head.weight"] = dense.state["model.embed_tokens.weight"].clone()  # untied: GLM-4.5 is
    for i in range(smol.num_layers):
        dst = f"model.layers.{i}.mlp."
        if i < first_moe:
            for name in ("gate_proj", "up_proj", "down_proj"):
                state[f"{dst}{name}.weight"] = dense.state[f"{dst}{name}.weight"]
            continue
        src = f"layers.{i}.mlp."
        state[f"{dst}gate.weight"] = split[f"{src}gate.weight"]
        state[f"{dst}gate.e_score_correction_bias"] = torch.zeros(smol.num_experts)
        for name in ("gate_proj", "up_proj", "down_proj"):
            routed = split[f"{src}experts.mlp.{name}.weight"]
            for e in range(smol.num_experts):
                state[f"{dst}experts.{e}.{name}.weight"] = routed.clone()
            real = split[f"{src}shared_expert.{name}.weight"]
            zeros = real.new_zeros((real.shape[0], pad) if name == "down_proj" else (pad, real.shape[1]))
            state[f"{dst}shared_experts.{name}.weight"] = torch.cat([real, zeros], dim=1 if name == "down_proj" else 0)
    config = glm4_moe_config(dense, smol.num_hash_layers, smol.num_experts, smol.top_k, size, shared,
                             smol.routed_scaling_factor)  # fmt: skip
    return state, config


def check_out(out: Path, overwrite: bool = False) -> None:
    """``out`` may be written: absent, an empty folder, or (with ``overwrite``) any folder."""
    if out.exists() and not (out.is_dir() and (overwrite or not any(out.iterdir()))):
        raise UsageError(f"{out} already exists and is not an empty folder", "choose another --out, or pass --force")


def export_hf(dense: DenseWeights, out: Path, overwrite: bool = False, format: str = "hf") -> ExportResult:
    """Write the dense model to ``out`` (a new folder, or an earlier export with ``overwrite``) in ``format``."""
    out = Path(out)
    check_out(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        if format == "glm4-moe":
            tensors, config = glm4_moe_state(dense)
        else:
            tensors = {k: v for k, v in dense.state.items() if k != "lm_head.weight"}
            config = hf_config(dense)
        state = {k: v.detach().float().contiguous() for k, v in tensors.items()}
        save_file(state, str(staging / "model.safetensors"), metadata={"format": "pt"})
        (staging / "config.json").write_text(json.dumps(config, indent=2, default=str) + "\n")
        eos = dense.hf_config.get("eos_token_id")
        generation = {"bos_token_id": dense.hf_config.get("bos_token_id"), "eos_token_id": eos}
        (staging / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        for item in dense.tokenizer_dir.iterdir():
            if item.is_file():
                shutil.copy2(item, staging / item.name)
        staging.chmod(0o755)  # mkdtemp made it private; the export is an ordinary folder
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    files = tuple(sorted(p.name for p in out.iterdir()))
    return ExportResult(
        out, format, files, sum(v.numel() for v in state.values()), str(dense.source), dense.source_sha256
    )
