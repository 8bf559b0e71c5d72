"""``speedtrap export --format hf``: the dense model smol-moe is built from, as a Hugging Face folder.

SmolLM2-135M-Instruct's weights as read from the GGUF file (dequantized, float32), saved as
``LlamaForCausalLM`` safetensors with its config, tokenizer and chat template, so that any server
(vLLM, SGLang, transformers) can serve the model speedtrap embeds. The folder is written atomically:
a crash leaves no half-written export.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from speedtrap._errors import UsageError
from speedtrap.targets.smolmoe.weights import DenseWeights

FORMATS = ("hf",)
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


def check_out(out: Path, overwrite: bool = False) -> None:
    """``out`` may be written: absent, an empty folder, or (with ``overwrite``) any folder."""
    if out.exists() and not (out.is_dir() and (overwrite or not any(out.iterdir()))):
        raise UsageError(f"{out} already exists and is not an empty folder", "choose another --out, or pass --force")


def export_hf(dense: DenseWeights, out: Path, overwrite: bool = False) -> ExportResult:
    """Write the dense model to ``out`` (a new folder, or an earlier export with ``overwrite``)."""
    out = Path(out)
    check_out(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        state = {k: v.detach().float().contiguous() for k, v in dense.state.items() if k != "lm_head.weight"}
        save_file(state, str(staging / "model.safetensors"), metadata={"format": "pt"})
        (staging / "config.json").write_text(json.dumps(hf_config(dense), indent=2, default=str) + "\n")
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
        out, "hf", files, sum(v.numel() for v in state.values()), str(dense.source), dense.source_sha256
    )
