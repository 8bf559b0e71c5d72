"""smol-moe against the dense model it was built from, on fixed text.

The reference is transformers' own ``LlamaForCausalLM`` holding the dense weights: an
implementation speedtrap did not write, so agreement is evidence, not a tautology.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from speedtrap.data import filler_paragraphs
from speedtrap.targets._base import InProcessModel
from speedtrap.targets.smolmoe.weights import DenseWeights

# Measured over 1,0xx tokens of filler text on CPU in float32 (see tests/targets/test_smolmoe.py).
MAX_ABS_LOGIT_DIFF_BOUND = 1e-3


@dataclass(frozen=True)
class EquivalenceResult:
    target: str
    patches: tuple[str, ...]
    tokens: int
    max_abs_logit_diff: float
    mean_abs_logit_diff: float
    top1_agreement: float
    bound: float

    @property
    def equivalent(self) -> bool:
        return self.top1_agreement >= 0.999 and self.max_abs_logit_diff <= self.bound

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["patches"] = list(self.patches)
        out["equivalent"] = self.equivalent
        return out


def equivalence_text_ids(model: InProcessModel, min_tokens: int = 1024) -> list[int]:
    """Fixed prose, at least ``min_tokens`` tokens."""
    text = " ".join(filler_paragraphs())
    ids: list[int] = model.tokenizer.encode(text, add_special_tokens=False)
    while len(ids) < min_tokens:
        ids = ids + ids
    return ids


def dense_reference(dense: DenseWeights) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**{k: v for k, v in dense.hf_config.items() if k not in {"architectures"}})
    with torch.device("meta"):
        ref = LlamaForCausalLM(config)
    ref.load_state_dict(dense.state, strict=False, assign=True)
    ref.tie_weights()
    ref.model.rotary_emb = type(ref.model.rotary_emb)(config)
    return ref.eval().requires_grad_(False)


@torch.inference_mode()
def check_equivalence(
    model: InProcessModel, reference: torch.nn.Module, patches: Sequence[str] = (), min_tokens: int = 1024
) -> EquivalenceResult:
    ids = equivalence_text_ids(model, min_tokens)
    batch = torch.tensor([ids])
    expected = reference(input_ids=batch).logits[0].float()
    with model.patched(patches):
        got = model.logits(ids).float()
    diff = (got - expected).abs()
    agree = (got.argmax(-1) == expected.argmax(-1)).float().mean().item()
    return EquivalenceResult(
        model.name,
        tuple(patches),
        len(ids),
        diff.max().item(),
        diff.mean().item(),
        agree,
        MAX_ABS_LOGIT_DIFF_BOUND,
    )
