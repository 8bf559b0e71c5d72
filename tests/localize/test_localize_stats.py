"""The comparison statistics against brute force in float64 (SGLang's formula, computed directly)."""

from __future__ import annotations

import math

import pytest
import torch

from speedtrap.localize._stats import Accumulator, as_rows, compare_rows, position_edges, row_sq_norms


def brute(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float, float]:
    x64, y64 = x.double(), y.double()
    xy, xx, yy = float((x64 * y64).sum()), float((x64 * x64).sum()), float((y64 * y64).sum())
    rel = 1 - 2 * xy / (xx + yy)
    return rel, float((x64 - y64).abs().max()), xy / math.sqrt(xx * yy)


@pytest.mark.parametrize("noise", [1e-1, 1e-3, 1e-5])
def test_rel_diff_max_abs_and_cosine_match_the_direct_formula(noise: float) -> None:
    gen = torch.Generator().manual_seed(int(1 / noise))
    x = torch.randn(40, 3, 24, generator=gen)
    y = x + noise * torch.randn(x.shape, generator=gen)
    acc = Accumulator(1)
    compare_rows(as_rows(x, 0), as_rows(y, 0), torch.arange(40), [0, 40], acc)
    rel, max_abs, cosine = brute(x, y)
    assert acc.rel_diff == pytest.approx(rel, rel=1e-5)
    assert acc.max_abs == pytest.approx(max_abs, rel=1e-6)
    assert acc.cosine == pytest.approx(cosine, abs=1e-9)


def test_tiny_differences_survive_where_the_direct_float32_formula_cancels() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=gen)
    y = x.clone()
    y[3, 7] = torch.nextafter(y[3, 7], torch.tensor(10.0))  # one ulp at one element
    acc = Accumulator(1)
    compare_rows(x, y, torch.arange(64), [0, 64], acc)
    expected = float(((x.double() - y.double()) ** 2).sum() / ((x.double() ** 2) + (y.double() ** 2)).sum())
    assert 0 < expected < 1e-15
    assert acc.rel_diff == pytest.approx(expected, rel=1e-5)
    direct32 = 1 - 2 * float((x * y).sum()) / float((x * x + y * y).sum())
    assert abs(direct32 - expected) >= 0.5 * expected  # the float32 direct formula loses it


def test_per_position_buckets_match_brute_force() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1, 50, 8, generator=gen)
    y = x.clone()
    y[0, 40:] += 0.5  # only late positions differ
    edges = position_edges(50)
    assert edges == [0, 16, 32, 50]
    acc = Accumulator(len(edges) - 1)
    compare_rows(as_rows(x, 1), as_rows(y, 1), torch.arange(50), edges, acc)
    rels = acc.bucket_rel()
    assert rels[0] == 0 and rels[1] == 0
    late_x, late_y = x[0, 32:].double(), y[0, 32:].double()
    want = float(((late_x - late_y) ** 2).sum() / (late_x**2 + late_y**2).sum())
    assert rels[2] == pytest.approx(want, rel=1e-5)


def test_row_norms_in_chunks_equal_one_pass() -> None:
    x = torch.randn(3000, 2000)
    assert torch.allclose(row_sq_norms(x), (x.double() ** 2).sum(-1), rtol=1e-5)


def test_bf16_inputs_are_compared_in_float32() -> None:
    x = torch.randn(10, 16).bfloat16()
    y = x.float() + 1e-3
    acc = Accumulator(0)
    compare_rows(x, y, None, [0], acc)
    rel, _, _ = brute(x.float(), y)
    assert acc.rel_diff == pytest.approx(rel, rel=1e-4)
