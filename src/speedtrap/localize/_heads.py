"""The baseline copy's output head, stubbed: its logits are recomputed once, in chunks, when compared."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from speedtrap.localize._pairing import canonical


def stub_output_head(root: nn.Module) -> dict[str, Callable[..., Any]]:
    """Stub out the baseline copy's output head (the lm_head: 85x its input on smol-moe).

    The copy is private to one layer diff. Its head returns a zero-stride tensor of the right shape
    (no memory, no GEMM); the patched side recomputes the real baseline logits from the recorded
    inputs, a chunk of rows at a time, so the head's GEMM runs once, not twice. Returns
    ``{module name: the real forward}``; empty when the head is not a plain linear map.
    """
    patch_root: Any = getattr(root, "patch_root", None)
    inner: Any = patch_root() if callable(patch_root) else root
    getter = getattr(inner, "get_output_embeddings", None)
    head = getter() if callable(getter) else getattr(inner, "lm_head", None)
    weight = getattr(head, "weight", None)
    if not isinstance(head, nn.Module) or not isinstance(weight, Tensor) or weight.dim() != 2:
        return {}
    name = next((n for n, m in root.named_modules() if m is head), None)
    if name is None or "forward" in vars(head):  # an instance forward already swapped: leave it
        return {}
    real = head.forward
    out_features = int(weight.shape[0])

    def stub(x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        return torch.zeros((), dtype=x.dtype).expand(*x.shape[:-1], out_features)

    head.forward = stub  # type: ignore[method-assign]
    return {canonical(name): real}
