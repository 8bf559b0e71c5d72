"""A Triton kernel's address arithmetic changed (the shape of a block-FP8 GEMM stepping its scale
pointers once per ``group_k``): a kernel-indexing signal naming the statement and the pointer update
it feeds; other changes to the kernel (what it accumulates) are not this signal."""

from __future__ import annotations

from pathlib import Path

from _triage_one import triage_one_file

from speedtrap.triage.ranking.rank import FORWARD

KERNEL = """\
import triton
import triton.language as tl


@triton.jit
def _block_matmul(A, B, C, As, Bs, K, group_k, stride_ak, stride_bk, stride_As_k, stride_Bs_k,
                  BLOCK_SIZE_K: tl.constexpr):
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = A + offs_k * stride_ak
    b_ptrs = B + offs_k * stride_bk
    As_ptrs = As
    Bs_ptrs = Bs
    n_tiles_k_per_group_k = group_k // BLOCK_SIZE_K
    accumulator = tl.zeros((16, 16), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
        a_s = tl.load(As_ptrs)
        b_s = tl.load(Bs_ptrs)
        scale_step_k = tl.where((k + 1) % n_tiles_k_per_group_k == 0, 1, 0)
        accumulator += tl.dot(a, b) * a_s * b_s
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk
        As_ptrs += scale_step_k * stride_As_k
        Bs_ptrs += scale_step_k * stride_Bs_k
    tl.store(C, accumulator)


def block_matmul(a, b, c, a_s, b_s, group_k):
    _block_matmul[(1,)](a, b, c, a_s, b_s, a.shape[-1], group_k, 1, 1, 1, 1, BLOCK_SIZE_K=64)
    return c
"""


def test_a_scale_pointer_step_changed(tmp_path: Path) -> None:
    after = KERNEL.replace(
        "    n_tiles_k_per_group_k = group_k // BLOCK_SIZE_K\n", "    scale_step_k = BLOCK_SIZE_K // group_k\n"
    ).replace("        scale_step_k = tl.where((k + 1) % n_tiles_k_per_group_k == 0, 1, 0)\n", "")
    tier, reasons = triage_one_file(tmp_path, "pkg/fp8_kernel.py", KERNEL, after)
    assert tier == 1
    assert "changes the address arithmetic of the Triton kernel _block_matmul" in reasons[0]
    assert "`scale_step_k = BLOCK_SIZE_K // group_k` feeds `As_ptrs += scale_step_k * stride_As_k`" in reasons[0]


def test_an_offset_changed(tmp_path: Path) -> None:
    after = KERNEL.replace("    a_ptrs = A + offs_k * stride_ak\n", "    a_ptrs = A + offs_k * stride_bk\n")
    _, reasons = triage_one_file(tmp_path, "pkg/fp8_kernel.py", KERNEL, after)
    assert "changes the address arithmetic of the Triton kernel _block_matmul" in reasons[0]


def test_what_the_kernel_accumulates_is_not_address_arithmetic(tmp_path: Path) -> None:
    after = KERNEL.replace(
        "        accumulator += tl.dot(a, b) * a_s * b_s\n", "        accumulator += tl.dot(a, b) * a_s\n"
    )
    _, reasons = triage_one_file(tmp_path, "pkg/fp8_kernel.py", KERNEL, after)
    assert not any("address arithmetic" in r for r in reasons)


def test_the_same_step_in_a_plain_function_is_not_a_kernel(tmp_path: Path) -> None:
    plain = KERNEL.replace("@triton.jit\n", "")
    after = plain.replace("    a_ptrs = A + offs_k * stride_ak\n", "    a_ptrs = A + offs_k * stride_bk\n")
    tier, reasons = triage_one_file(tmp_path, "pkg/fp8_kernel.py", plain, after)
    assert tier == 2
    assert reasons[0].startswith(FORWARD)
