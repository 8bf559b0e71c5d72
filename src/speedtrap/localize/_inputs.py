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


def folder_ids(folder: str | None, tokens: int) -> list[int]:
    """The ids a server's live localize sends: the filler prose through the tokenizer of the model folder the
    manifest serves (the ids ``default_ids`` gives ``hf:<folder>`` in-process), else ids seeded from its
    ``config.json``'s ``vocab_size``."""
    import json
    from pathlib import Path

    if tokens < 2:
        raise UsageError(f"--tokens {tokens} is too few", "pass --tokens 2 or more")
    path = Path(folder) if folder else None
    if path is None or not path.is_dir():
        raise UsageError(
            "live localize needs the served model's folder to make its prompt (target.model)",
            'set target.model = "path/to/the/model/folder" in the manifest',
        )
    tokenizer = None
    if any((path / name).exists() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError):
            tokenizer = None
    if tokenizer is not None:
        ids: list[int] = tokenizer.encode(" ".join(filler_paragraphs()), add_special_tokens=False)
        while len(ids) < tokens:
            ids = ids + ids
        return ids[:tokens]
    try:
        vocab = int(json.loads((path / "config.json").read_text()).get("vocab_size", 0))
    except (OSError, ValueError, TypeError):
        vocab = 0
    if vocab < 2:
        raise UsageError(f"{path} has neither a tokenizer nor a config.json with vocab_size", "point at a model folder")
    generator = torch.Generator().manual_seed(SEED)
    return [int(t) for t in torch.randint(0, vocab, (tokens,), generator=generator)]
