"""Atomic result files: JSON, and tensors as safetensors (or plain tensors for torch.load(weights_only=True))."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# -- files --------------------------------------------------------------------------------------


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def write_tensors(stem: Path, tensors: dict[str, Any]) -> Path:
    """safetensors when the engine's venv has it, else ``torch.save`` of plain tensors (read with weights_only)."""
    try:
        from safetensors.torch import save_file
    except ImportError:
        import torch

        path = stem.with_suffix(".pt")
        tmp = path.with_name(f".{path.name}.tmp")
        torch.save(tensors, tmp)
    else:
        path = stem.with_suffix(".safetensors")
        tmp = path.with_name(f".{path.name}.tmp")
        save_file(tensors, str(tmp))
    os.replace(tmp, path)
    return path
