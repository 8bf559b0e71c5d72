"""A keyword argument turned positional at a call is bound against the callee's signature: when a parameter sits
at that position before the keyword's own (one inserted into the signature), the value lands there and the
keyword's parameter takes its default. The tree is a trimmed copy of SGLang 0.5.1's KV-index Triton kernel
(``layers/attention/utils.py``, ``NUM_PAGE_PER_BLOCK`` before ``PAGED_SIZE``) and a cutlass-MLA-style backend
that launches it, the shape of sglang#8685 reversed.
"""

from __future__ import annotations

from pathlib import Path

from _triage_one import triage_edit

from speedtrap.triage import PatchReport

KERNEL = """\
import triton
import triton.language as tl

TRITON_PAD_NUM_PAGE_PER_BLOCK = 64


@triton.jit
def create_flashmla_kv_indices_triton(
    req_to_token_ptr,
    req_pool_indices_ptr,
    page_kernel_lens_ptr,
    kv_start_idx,
    kv_indices_ptr,
    req_to_token_ptr_stride: tl.constexpr,
    kv_indices_ptr_stride: tl.constexpr,
    {inserted}PAGED_SIZE: tl.constexpr = 64,
):
    pid = tl.program_id(axis=0)
    req_pool_index = tl.load(req_pool_indices_ptr + pid)
    kv_end = tl.load(page_kernel_lens_ptr + pid)
    num_paged = tl.cdiv(kv_end, PAGED_SIZE)
    offset = tl.arange(0, 64) * PAGED_SIZE
    data = tl.load(req_to_token_ptr + req_pool_index * req_to_token_ptr_stride + offset)
    tl.store(kv_indices_ptr + pid * kv_indices_ptr_stride + tl.arange(0, 64), data // PAGED_SIZE, mask=num_paged > 0)
"""
INSERTED = "NUM_PAGE_PER_BLOCK: tl.constexpr = TRITON_PAD_NUM_PAGE_PER_BLOCK,\n    "

BACKEND = """\
from pkg.utils import create_flashmla_kv_indices_triton

PAGE_SIZE = 128


class CutlassMLABackend:
    def init_forward_metadata(self, forward_batch):
        bs = forward_batch.batch_size
        block_kv_indices = self.alloc(bs)
        create_flashmla_kv_indices_triton[(bs,)](
            self.req_to_token,
            forward_batch.req_pool_indices,
            forward_batch.seq_lens,
            None,
            block_kv_indices,
            self.req_to_token.stride(0),
            self.max_seqlen_pad,
            PAGED_SIZE=PAGE_SIZE,
        )
        self.forward_metadata = block_kv_indices
"""


def _triage(tmp_path: Path, kernel: str, old: str, new: str) -> PatchReport:
    others = {"pkg/__init__.py": "", "pkg/utils.py": kernel}
    return triage_edit(tmp_path, "pkg/backend.py", BACKEND, old, new, others)


def test_a_keyword_turned_positional_lands_in_an_inserted_parameter(tmp_path: Path) -> None:
    kernel = KERNEL.replace("{inserted}", INSERTED)
    report = _triage(tmp_path, kernel, "PAGED_SIZE=PAGE_SIZE,", "PAGE_SIZE,")
    said = [r for r in report.ranking.in_full if "positionally" in r]
    assert said, report.ranking.reasons
    assert "lands in `NUM_PAGE_PER_BLOCK` (argument 8)" in said[0] and "`PAGED_SIZE` takes its default" in said[0]
    assert report.ranking.risk >= 2, report.ranking.points


def test_a_keyword_turned_positional_at_its_own_position_is_not_said(tmp_path: Path) -> None:
    """The same launch against the signature without the inserted parameter: argument 8 is ``PAGED_SIZE``, the
    same binding as the keyword."""
    kernel = KERNEL.replace("{inserted}", "")
    report = _triage(tmp_path, kernel, "PAGED_SIZE=PAGE_SIZE,", "PAGE_SIZE,")
    assert not any("positionally" in r for r in report.ranking.reasons), report.ranking.reasons
