"""A copy of an HF model folder with one all-zero attention head group added, for tensor parallelism 2.

vLLM refuses 9 query heads at ``--tensor-parallel-size 2`` (../shared/tp-cpu.md). One more KV head with its
query heads (9 + 3 = 12 query heads, 3 + 1 = 4 KV heads), every weight of the new heads zero, computes the
same function: the new queries and values are zero (so are their biases), so the new heads' attention
output is zero, and ``o_proj``'s columns for them are zero as well. ``head_dim`` is written into the config
(``hidden_size / heads`` changes).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _stacks import locked  # tests/ is not a package: found through sys.path


def padded(src: Path, dst: Path, groups: int = 1) -> Path:
    """``dst``: ``src`` with ``groups`` zero KV-head groups added (built once; a ready marker last)."""
    with locked(dst.parent / f".{dst.name}.lock"):
        if (dst / ".ready").exists():
            return dst
        from safetensors.torch import load_file, save_file

        shutil.rmtree(dst, ignore_errors=True)
        dst.mkdir(parents=True)
        config = json.loads((src / "config.json").read_text())
        heads, kv = int(config["num_attention_heads"]), int(config["num_key_value_heads"])
        head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
        per_group = heads // kv
        add_q, add_kv = groups * per_group * head_dim, groups * head_dim
        tensors = load_file(str(src / "model.safetensors"))
        out = {}
        for name, t in tensors.items():
            if name.endswith(("q_proj.weight", "q_proj.bias")):
                t = torch.cat([t, t.new_zeros((add_q, *t.shape[1:]))])
            elif name.endswith(("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias")):
                t = torch.cat([t, t.new_zeros((add_kv, *t.shape[1:]))])
            elif name.endswith("o_proj.weight"):
                t = torch.cat([t, t.new_zeros((t.shape[0], add_q))], dim=1)
            out[name] = t.contiguous()
        save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
        config |= {"num_attention_heads": heads + groups * per_group, "num_key_value_heads": kv + groups}
        config["head_dim"] = head_dim
        (dst / "config.json").write_text(json.dumps(config, indent=2))
        for extra in src.iterdir():
            if extra.name not in ("config.json", "model.safetensors") and extra.is_file():
                shutil.copy2(extra, dst / extra.name)
        (dst / ".ready").write_text("")
    return dst
