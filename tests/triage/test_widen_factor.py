"""A widened condition that decides where a factor is applied (``_fuses_<factor>_in_topk``), linked by
name to the kernels of the cases it now admits: the sites that hand the factor to a kernel not read
here in files named after the dropped atoms (``is_marlin`` -> ``marlin``), and only those."""

from __future__ import annotations

import difflib
import textwrap
from pathlib import Path

from speedtrap.triage import PatchReport, from_diff_files, triage
from speedtrap.triage.flow.widened_factor_condition import words

FILES = {
    "pkg/__init__.py": "",
    "pkg/layer.py": """\
        def _fuses_routed_scaling_factor_in_topk(method, backend):
            return method.fuse_in_topk or (method.is_fp4 and not (backend.is_marlin() or backend.is_lora_marlin()))


        class MoE:
            def __init__(self, method, backend, routed_scaling_factor):
                self.fuse = _fuses_routed_scaling_factor_in_topk(method, backend)
                self.routed_scaling_factor = routed_scaling_factor
        """,
    "pkg/fused_marlin_moe.py": """\
        from some_kernels import moe_sum_reduce


        def fused_marlin_moe(x, out, routed_scaling_factor=None):
            if routed_scaling_factor is None:
                routed_scaling_factor = 1.0
            moe_sum_reduce(x, out, routed_scaling_factor)
            return out
        """,
    "pkg/marlin_runner.py": """\
        from pkg.fused_marlin_moe import fused_marlin_moe


        def run(x, out, cfg):
            return fused_marlin_moe(x, out, routed_scaling_factor=cfg.routed_scaling_factor)
        """,
    "pkg/cutlass_moe.py": """\
        from some_kernels import cutlass_reduce


        def cutlass_moe(x, routed_scaling_factor):
            return cutlass_reduce(x, routed_scaling_factor)
        """,
}


def run(tmp_path: Path, old: str, new: str, symbol: str | None = "routed_scaling_factor") -> PatchReport:
    root = tmp_path / "tree"
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    before = (root / "pkg/layer.py").read_text()
    after = before.replace(old, new)
    assert after != before
    diff = difflib.unified_diff(before.splitlines(True), after.splitlines(True), "a/pkg/layer.py", "b/pkg/layer.py")
    (tmp_path / "p.diff").write_text("".join(diff))
    [report] = triage(from_diff_files([tmp_path / "p.diff"], root), symbol).patches
    return report


def test_words_are_what_the_dropped_atoms_share() -> None:
    assert words(["is_marlin", "is_lora_marlin"]) == ["marlin"]
    assert words(["is_cutlass"]) == ["cutlass"]
    assert words(["use_triton", "is_cutlass"]) == ["triton", "cutlass"]
    assert words(["backend", "none"]) == []


def test_dropping_the_marlin_exclusion_names_the_marlin_kernel_site(tmp_path: Path) -> None:
    report = run(
        tmp_path,
        "(method.is_fp4 and not (backend.is_marlin() or backend.is_lora_marlin()))",
        "method.is_fp4",
    )
    assert report.tier == 1
    [warning] = [m for m in report.missing if "widened condition" in m]
    assert "pkg/fused_marlin_moe.py:7 (fused_marlin_moe, passed to moe_sum_reduce())" in warning
    assert "linked by name: marlin" in warning
    assert "marlin_runner.py" not in warning  # handed to a function the tree defines: followed, not a kernel
    assert "cutlass" not in warning  # a case the widening did not admit


def test_no_link_without_the_factor_or_without_a_named_case(tmp_path: Path) -> None:
    # the factor is not named by the predicate: nothing to link
    report = run(
        tmp_path / "a",
        "(method.is_fp4 and not (backend.is_marlin() or backend.is_lora_marlin()))",
        "method.is_fp4",
        symbol=None,
    )
    assert not [m for m in report.missing if "widened condition" in m]
    # the dropped atom names no file that applies the factor
    report = run(tmp_path / "b", "method.fuse_in_topk or (method.is_fp4 and", "method.fuse_in_topk or (True and")
    assert not [m for m in report.missing if "widened condition" in m]
