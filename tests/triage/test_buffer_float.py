"""A value applied as a Python float where it was a registered buffer (the shape of an embedding normaliser
``register_buffer("normalizer", torch.tensor(hidden_size**0.5))``, rounded to the model dtype, replaced by
the float): a precision signal naming the buffer; a buffer kept, or removed without the float, is not."""

from __future__ import annotations

from pathlib import Path

from _triage_one import triage_one_file

MODEL = """\
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        normalizer = self.config.hidden_size**0.5
        self.register_buffer("normalizer", torch.tensor(normalizer), persistent=False)

    def forward(self, ids):
        hidden_states = self.embed(ids)
        hidden_states *= self.normalizer
        return hidden_states
"""

FLOAT = MODEL.replace(
    "        normalizer = self.config.hidden_size**0.5\n"
    '        self.register_buffer("normalizer", torch.tensor(normalizer), persistent=False)\n',
    "",
).replace("        hidden_states *= self.normalizer\n", "        hidden_states *= self.config.hidden_size**0.5\n")


def test_a_buffer_replaced_by_its_float(tmp_path: Path) -> None:
    _, reasons = triage_one_file(tmp_path, "pkg/model.py", MODEL, FLOAT)
    said = [r for r in reasons if r.startswith("applies `self.config.hidden_size ** 0.5` as a Python float")]
    assert said and "where it was the buffer `normalizer` (pkg/model.py:11)" in said[0]


def test_the_buffer_kept_is_no_precision_change(tmp_path: Path) -> None:
    after = MODEL.replace(
        "        hidden_states *= self.normalizer\n", "        hidden_states = hidden_states * self.normalizer\n"
    )
    _, reasons = triage_one_file(tmp_path, "pkg/model.py", MODEL, after)
    assert not any("as a Python float" in r for r in reasons)
