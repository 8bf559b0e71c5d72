"""A slice moved between functions (the shape of an attention helper that un-pads its output before the
caller merges partial results, instead of after): a view signal naming both places; a slice kept in
place, or another subscript, is not."""

from __future__ import annotations

from pathlib import Path

from _triage_one import triage_one_file

from speedtrap.triage.ranking.rank import FORWARD

IMPL = """\
import torch
from some_kernels import flash_attn, merge_attn_states


class Impl:
    def _attn(self, q, k, v):
        padded_v = torch.nn.functional.pad(v, [0, q.shape[-1] - v.shape[-1]])
        out, lse = flash_attn(q, k, padded_v)
        return out, lse

    def forward(self, q, k, v, context):
        out, lse = self._attn(q, k, v)
        ctx_out, ctx_lse = self._attn(q, context, context)
        output = torch.empty_like(out)
        merge_attn_states(output, ctx_out, ctx_lse, out, lse)
        output = output[..., : v.shape[-1]]
        return output.flatten(start_dim=-2)
"""

MOVED = IMPL.replace(
    "        out, lse = flash_attn(q, k, padded_v)\n",
    "        out, lse = flash_attn(q, k, padded_v)\n        out = out[..., : v.shape[-1]]\n",
).replace("        output = output[..., : v.shape[-1]]\n", "")


def test_a_slice_moved_before_the_merge(tmp_path: Path) -> None:
    _, reasons = triage_one_file(tmp_path, "pkg/mla.py", IMPL, MOVED)
    assert reasons[0].startswith("moves the slice `[..., :v.shape[-1]]` from Impl.forward (pkg/mla.py:16)")
    assert "to Impl._attn (pkg/mla.py:9)" in reasons[0]


def test_a_slice_changed_in_place_is_not_a_move(tmp_path: Path) -> None:
    after = IMPL.replace(
        "        output = output[..., : v.shape[-1]]\n", "        output = output[..., : q.shape[-1]]\n"
    )
    tier, reasons = triage_one_file(tmp_path, "pkg/mla.py", IMPL, after)
    assert not any(r.startswith("moves the slice") for r in reasons)
    assert tier == 2 and reasons[0].startswith(FORWARD)


def test_the_same_slice_removed_only_is_not_a_move(tmp_path: Path) -> None:
    after = IMPL.replace("        output = output[..., : v.shape[-1]]\n", "")
    _, reasons = triage_one_file(tmp_path, "pkg/mla.py", IMPL, after)
    assert not any(r.startswith("moves the slice") for r in reasons)
