"""The tokens the localizer runs on: fixed prose when the model has a tokenizer, else seeded ids."""

from __future__ import annotations

import torch

from speedtrap._errors import UsageError
from speedtrap.data import filler_paragraphs
from speedtrap.targets import InProcessModel

SEED = 0


def default_ids(model: InProcessModel, tokens: int) -> list[int]:
    """``tokens`` token ids: the shipped filler prose (tokenized), or seeded random ids."""
    if tokens < 2:
        raise UsageError(f"--tokens {tokens} is too few", "pass --tokens 2 or more")
    if model.tokenizer is not None:
        ids: list[int] = model.tokenizer.encode(" ".join(filler_paragraphs()), add_special_tokens=False)
        while len(ids) < tokens:
            ids = ids + ids
        return ids[:tokens]
    vocab = int(model.config.get("vocab_size", 0))
    if vocab < 2:
        raise UsageError(f"{model.name} has neither a tokenizer nor a vocab_size", "use a target with a tokenizer")
    generator = torch.Generator().manual_seed(SEED)
    return [int(t) for t in torch.randint(0, vocab, (tokens,), generator=generator)]
