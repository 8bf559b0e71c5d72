"""Reachability from the served platform (``--platform cuda``): a change the platform can never select
(under ``if _is_hip:``, in a ROCm-only kernel, in the dispatch's other platform class) drops one tier and
says why; a change it can select (``if _is_cuda or _is_hip:``, after the branch, the ``else`` of
``if _is_hip:``) does not. Trees shaped like SGLang 0.5 and vLLM 0.33's code, small."""

from __future__ import annotations

import ast
import difflib
import itertools
import json
from pathlib import Path

import pytest
from _triage_one import lay_tree
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from speedtrap._errors import ManifestError, UsageError
from speedtrap.cli import app
from speedtrap.spec import Platform
from speedtrap.triage import from_diff_files, triage
from speedtrap.triage.platform.conditions import Conditions
from speedtrap.triage.platform.placement import line_block
from speedtrap.triage.source.pyast import parse_module

# -- SGLang's shape: module-level aliases of utils' predicates, a custom op dispatching on them ---------

SGL = {
    "sgl/__init__.py": "",
    "sgl/srt/__init__.py": "",
    "sgl/srt/layers/__init__.py": "",
    "sgl/srt/utils.py": """\
        import os

        import torch


        def is_hip() -> bool:
            return torch.version.hip is not None


        def is_cuda():
            return torch.cuda.is_available() and torch.version.cuda


        def is_cpu() -> bool:
            return os.getenv("SGLANG_USE_CPU_ENGINE", "0") == "1"


        def get_bool_env_var(name):
            return os.getenv(name, "0") == "1"
        """,
    "sgl/srt/custom_op.py": """\
        from torch import nn

        from sgl.srt.utils import is_cpu, is_cuda, is_hip

        _is_cuda = is_cuda()
        _is_hip = is_hip()
        _is_cpu = is_cpu()


        class CustomOp(nn.Module):
            def __init__(self):
                super().__init__()
                self._forward_method = self.dispatch_forward()

            def forward(self, *args, **kwargs):
                return self._forward_method(*args, **kwargs)

            def dispatch_forward(self):
                if _is_cuda:
                    return self.forward_cuda
                elif _is_hip:
                    return self.forward_hip
                elif _is_cpu:
                    return self.forward_cpu
                else:
                    return self.forward_native
        """,
    "sgl/srt/layers/fp8_utils.py": """\
        import torch

        from sgl.srt.utils import get_bool_env_var, is_cuda, is_hip

        _is_hip = is_hip()
        _is_cuda = is_cuda()

        _use_aiter = get_bool_env_var("SGLANG_USE_AITER") and _is_hip

        if _use_aiter:
            from sgl.srt.layers.aiter_ops import aiter_quant


        def dispatch_linear():
            if _is_cuda:
                return cutlass_linear
            elif _use_aiter:
                return aiter_linear
            else:
                return triton_linear


        def cutlass_linear(x, w, scale):
            return torch.mm(x, w) * scale


        def aiter_linear(x, w, scale):
            q = aiter_quant(x)
            return torch.mm(q, w) * scale


        def triton_linear(x, w, scale):
            return torch.mm(x, w) * scale


        def scaled(x, scale):
            if _is_cuda or _is_hip:
                x = x * scale
            if _is_hip:
                x = x.contiguous()
            else:
                x = x.clone()
            return x + 0
        """,
    "sgl/srt/layers/aiter_ops.py": """\
        AITER_SCALE = 2.0


        def aiter_quant(x):
            return x * AITER_SCALE
        """,
    "sgl/srt/layers/rocm_named.py": """\
        def helper(x):
            return x * 3
        """,
    "sgl/srt/layers/activation.py": """\
        import torch

        from sgl.srt.custom_op import CustomOp
        from sgl.srt.layers.rocm_named import helper


        class SiluAndMul(CustomOp):
            def forward_native(self, x):
                return torch.nn.functional.silu(x)

            def forward_cuda(self, x):
                return torch.nn.functional.silu(x) * 1

            def forward_hip(self, x):
                return torch.nn.functional.silu(x) * 2

            def forward_cpu(self, x):
                return helper(x)
        """,
    "sgl/csrc/kernel.cu": "__global__ void k(float* x) { x[0] = 1.0f; }\n",
}

# -- vLLM's shape: current_platform, the dispatch's <name>_platform_plugin, a module imported under a test

VLLM = {
    "vl/__init__.py": "",
    "vl/platforms/__init__.py": """\
        def cuda_platform_plugin() -> str | None:
            is_cuda = True
            return "vl.platforms.cuda.CudaPlatform" if is_cuda else None


        def rocm_platform_plugin() -> str | None:
            is_rocm = False
            return "vl.platforms.rocm.RocmPlatform" if is_rocm else None


        def cpu_platform_plugin() -> str | None:
            return "vl.platforms.cpu.CpuPlatform"
        """,
    "vl/platforms/interface.py": """\
        class Platform:
            def is_rocm(self) -> bool:
                return False
        """,
    "vl/platforms/cuda.py": """\
        from vl.platforms.interface import Platform


        class CudaPlatform(Platform):
            def get_attn_backend_cls(self):
                return "vl.attention.flash.FlashBackend"
        """,
    "vl/platforms/rocm.py": """\
        from vl.platforms.interface import Platform


        def on_gfx9() -> bool:
            return True


        class RocmPlatform(Platform):
            def get_attn_backend_cls(self):
                return "vl.attention.rocm_attn.RocmBackend"
        """,
    "vl/platforms/cpu.py": """\
        from vl.platforms.interface import Platform


        class CpuPlatform(Platform):
            pass
        """,
    "vl/attention/__init__.py": "",
    "vl/attention/flash.py": """\
        class FlashBackend:
            def forward(self, q):
                return q * 1
        """,
    "vl/attention/rocm_attn.py": """\
        class RocmBackend:
            def forward(self, q):
                return q * 1
        """,
    "vl/ops/__init__.py": "",
    "vl/ops/rocm_kernels.py": """\
        def fused_rope(q):
            return q * 2
        """,
    "vl/layers/__init__.py": "",
    "vl/layers/moe.py": """\
        from vl.platforms import current_platform

        if current_platform.is_rocm():
            from vl.ops.rocm_kernels import fused_rope


        def moe(x, block_m, num_stages_rocm):
            if current_platform.is_rocm():
                block_n = block_m
                stages = num_stages_rocm
            elif block_m <= 8:
                block_n = 64
                stages = 3
            else:
                block_n = 128
                stages = 4
            if current_platform.is_cuda_alike():
                x = x * block_n
            return x * stages
        """,
}


@pytest.fixture
def sgl(tmp_path: Path) -> Path:
    return lay_tree(tmp_path / "sgl-tree", SGL)


@pytest.fixture
def vl(tmp_path: Path) -> Path:
    return lay_tree(tmp_path / "vl-tree", VLLM)


def _diff(tree: Path, rel: str, old: str, new: str, out: Path) -> Path:
    """A diff replacing the one occurrence of ``old`` in ``rel`` with ``new``."""
    before = (tree / rel).read_text()
    assert before.count(old) == 1, (rel, old)
    after = before.replace(old, new)
    out.write_text(
        "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{rel}", f"b/{rel}"))
    )
    return out


def _one(tree: Path, diff: Path, platform: str | None) -> tuple[int, tuple[str, ...]]:
    p = triage(from_diff_files([diff], tree), None, None, Platform(platform) if platform else None).patches[0]
    return p.tier, p.ranking.in_full  # each reason with its evidence lines


FP8 = "sgl/srt/layers/fp8_utils.py"


def test_a_change_under_if_is_hip_drops_a_tier_on_cuda_and_says_why(sgl: Path, tmp_path: Path) -> None:
    d = _diff(sgl, FP8, "x = x.contiguous()", "x = x.contiguous() * 1.5", tmp_path / "hip.diff")
    assert _one(sgl, d, None)[0] == 2
    on_cuda, why = _one(sgl, d, "cuda")
    assert on_cuda == 3
    assert why[0].startswith(f"not selectable on platform cuda: under `if _is_hip:` ({FP8}:39), false on cuda")
    assert "_is_hip = is_hip()" in why[0]
    on_rocm, why_rocm = _one(sgl, d, "rocm")
    assert on_rocm == 2
    assert why_rocm[-1].startswith("selectable on platform rocm as far as read")


def test_a_branch_both_gpus_take_and_the_code_after_it_stay(sgl: Path, tmp_path: Path) -> None:
    both = _diff(sgl, FP8, "x = x * scale\n", "x = x * scale * 2\n", tmp_path / "both.diff")
    after = _diff(sgl, FP8, "return x + 0", "return x + 1", tmp_path / "after.diff")
    for platform in ("cuda", "rocm"):
        assert _one(sgl, both, platform)[0] == 2
        assert _one(sgl, after, platform)[0] == 2
    tier, why = _one(sgl, both, "cpu")  # neither GPU: the branch is not taken
    assert tier == 3 and why[0].startswith("not selectable on platform cpu: under `if _is_cuda or _is_hip:`")
    assert _one(sgl, after, "cpu")[0] == 2


def test_the_else_of_if_is_hip_runs_on_cuda_not_on_rocm(sgl: Path, tmp_path: Path) -> None:
    d = _diff(sgl, FP8, "x = x.clone()", "x = x.clone() * 1.5", tmp_path / "else.diff")
    assert _one(sgl, d, "cuda")[0] == 2
    tier, why = _one(sgl, d, "rocm")
    assert tier == 3
    assert why[0].startswith(f"not selectable on platform rocm: after `if _is_hip:` ({FP8}:39), which is always taken")


def test_an_elif_on_an_env_and_hip_alias_is_not_selectable_on_cuda(sgl: Path, tmp_path: Path) -> None:
    d = _diff(sgl, FP8, "return aiter_linear", "return aiter_linear if True else None", tmp_path / "elif.diff")
    tier, why = _one(sgl, d, "cuda")  # the `if _is_cuda:` before it is always taken on cuda
    assert tier == 3
    assert why[0].startswith(f"not selectable on platform cuda: after `if _is_cuda:` ({FP8}:15), which is always taken")
    tier, why = _one(sgl, d, "cpu")  # on cpu `_is_cuda` is false, and `_use_aiter` too
    assert tier == 3
    assert why[0].startswith(f"not selectable on platform cpu: under `elif _use_aiter:` ({FP8}:17), false on cpu")
    assert "_use_aiter = get_bool_env_var('SGLANG_USE_AITER') and _is_hip" in why[0]
    # on rocm the environment decides: not demoted
    assert _one(sgl, d, "rocm")[0] == 2
    # the `else` after `if _is_cuda: ... elif _use_aiter:` is never taken on cuda, may be on rocm
    e = _diff(sgl, FP8, "return triton_linear", "return triton_linear if True else None", tmp_path / "e.diff")
    assert _one(sgl, e, "cuda")[0] == 3 and _one(sgl, e, "rocm")[0] == 2


def test_a_kernel_only_the_other_platform_selects(sgl: Path, tmp_path: Path) -> None:
    """A function referred to only under ``elif _use_aiter:``, and the module imported only under
    ``if _use_aiter:``: neither runs on cuda."""
    fn = _diff(sgl, FP8, "q = aiter_quant(x)", "q = aiter_quant(x) * 1.5", tmp_path / "fn.diff")
    tier, why = _one(sgl, fn, "cuda")
    assert tier == 3
    assert why[0].startswith("not selectable on platform cuda: in aiter_linear, which is only referred to where")
    assert _one(sgl, fn, "rocm")[0] == 2
    mod = _diff(sgl, "sgl/srt/layers/aiter_ops.py", "= 2.0", "= 2.5", tmp_path / "mod.diff")
    tier, why = _one(sgl, mod, "cuda")
    assert tier == 3
    assert "sgl/srt/layers/aiter_ops.py is only imported where platform cuda cannot go" in why[0]
    assert _one(sgl, mod, "rocm")[0] == 2


def test_a_custom_ops_forward_hip_is_not_selectable_on_cuda(sgl: Path, tmp_path: Path) -> None:
    rel = "sgl/srt/layers/activation.py"
    hip = _diff(sgl, rel, "silu(x) * 2", "silu(x) * 3", tmp_path / "hip.diff")
    cuda = _diff(sgl, rel, "silu(x) * 1", "silu(x) * 3", tmp_path / "cuda.diff")
    tier, why = _one(sgl, hip, "cuda")
    assert tier == 3 and why[0].startswith("not selectable on platform cuda: in forward_hip, which is only referred")
    assert "sgl/srt/custom_op.py" in why[0]
    assert _one(sgl, hip, "rocm")[0] == 2
    assert _one(sgl, cuda, "cuda")[0] == 2
    assert _one(sgl, cuda, "rocm")[0] == 3


def test_a_name_alone_demotes_nothing_and_other_files_are_not_decided(sgl: Path, tmp_path: Path) -> None:
    """``rocm_named.py`` is imported where every platform goes: its name says nothing; a .cu file is not
    read for platforms; a diff of both is ranked on the Python file."""
    named = _diff(sgl, "sgl/srt/layers/rocm_named.py", "x * 3", "x * 4", tmp_path / "n.diff")
    assert _one(sgl, named, "cuda")[0] == 2
    cu = _diff(sgl, "sgl/csrc/kernel.cu", "1.0f", "2.0f", tmp_path / "cu.diff")
    tier_none, _ = _one(sgl, cu, None)
    tier, why = _one(sgl, cu, "rocm")
    assert tier == tier_none
    assert why[-1] == "platform rocm not decided: sgl/csrc/kernel.cu is not Python"


def test_the_served_platforms_change_ranks_above_the_others(sgl: Path, tmp_path: Path) -> None:
    hip = _diff(sgl, FP8, "x = x.contiguous()", "x = x.contiguous() * 1.5", tmp_path / "hip.diff")
    mine = _diff(sgl, FP8, "return x + 0", "return x + 1", tmp_path / "mine.diff")
    report = triage(from_diff_files([hip, mine], sgl), None, None, Platform.CUDA)
    assert [(p.name, p.tier) for p in report.patches] == [("mine", 2), ("hip", 3)]


def test_the_model_and_the_platform_demote_one_tier_together(
    sgl: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Code neither the served model nor the platform runs is one tier lower, not two."""
    models = sgl / "sgl/srt/models"
    models.mkdir()
    (models / "__init__.py").write_text("")
    (models / "llama.py").write_text("from sgl.srt.layers.activation import SiluAndMul\n\n\nclass Llama:\n    pass\n")
    (models / "qwen.py").write_text(
        "from sgl.srt.utils import is_hip\n\n_is_hip = is_hip()\n\n\nclass Qwen:\n    def forward(self, x):\n"
        "        if _is_hip:\n            x = x * 2\n        return x\n"
    )
    d = _diff(sgl, "sgl/srt/models/qwen.py", "x = x * 2", "x = x * 3", tmp_path / "q.diff")
    assert triage(from_diff_files([d], sgl)).patches[0].tier == 2
    import dataclasses

    from speedtrap.triage.ranking import run as _run

    real_rank = _run.rank
    # ranked tier 1 (as a risky pattern would be), so two demotions would show as tier 3
    monkeypatch.setattr(_run, "rank", lambda *a: dataclasses.replace(real_rank(*a), tier=1))
    assert triage(from_diff_files([d], sgl)).patches[0].tier == 1
    p = triage(from_diff_files([d], sgl), None, "Llama", Platform.CUDA).patches[0]
    assert p.tier == 2
    assert p.ranking.reasons[0].startswith("not selectable on platform cuda: under `if _is_hip:`")
    assert p.ranking.reasons[1].startswith("not reachable from the served model Llama")
    assert triage(from_diff_files([d], sgl), None, None, Platform.CUDA).patches[0].tier == 2


# -- vLLM -------------------------------------------------------------------------------------------


def test_vllm_current_platform_branches(vl: Path, tmp_path: Path) -> None:
    rel = "vl/layers/moe.py"
    rocm = _diff(vl, rel, "stages = num_stages_rocm", "stages = num_stages_rocm + 1", tmp_path / "r.diff")
    elif_ = _diff(vl, rel, "block_n = 64", "block_n = 32", tmp_path / "e.diff")
    alike = _diff(vl, rel, "x = x * block_n", "x = x * block_n * 2", tmp_path / "a.diff")
    tier, why = _one(vl, rocm, "cuda")
    assert tier == 3
    assert why[0] == f"not selectable on platform cuda: under `if current_platform.is_rocm():` ({rel}:8), false on cuda"
    assert _one(vl, rocm, "rocm")[0] == 2
    assert _one(vl, elif_, "cuda")[0] == 2
    tier, why = _one(vl, elif_, "rocm")
    assert tier == 3 and why[0].startswith("not selectable on platform rocm: after `if current_platform.is_rocm():`")
    assert [_one(vl, alike, p)[0] for p in ("cuda", "rocm", "cpu", "xpu")] == [2, 2, 3, 3]


def test_vllm_dispatch_class_and_a_module_imported_only_on_rocm(vl: Path, tmp_path: Path) -> None:
    plat = _diff(vl, "vl/platforms/rocm.py", "rocm_attn.RocmBackend", "rocm_attn.RocmBackend2", tmp_path / "p.diff")
    tier, why = _one(vl, plat, "cuda")
    assert tier == 3
    assert why[0].startswith("not selectable on platform cuda: in class RocmPlatform")
    assert (
        "not selectable on platform cuda: in class RocmPlatform, which the release's platform dispatch selects "
        "only for rocm (vl/platforms/__init__.py:8 rocm_platform_plugin)"
    ) in why[0]
    assert _one(vl, plat, "rocm")[0] == 2
    assert _one(vl, plat, "npu")[0] == 2  # no plugin for npu in the tree: not decided
    kern = _diff(vl, "vl/ops/rocm_kernels.py", "q * 2", "q * 3", tmp_path / "k.diff")
    tier, why = _one(vl, kern, "cuda")
    assert tier == 3
    assert why[0].split("\n")[-1] == (  # the whole reason, as the evidence line below its one-line headline
        "not selectable on platform cuda: in fused_rope, which is only referred to where platform cuda cannot go "
        "(vl/layers/moe.py:4: under `if current_platform.is_rocm():` (vl/layers/moe.py:3), false on cuda)"
    )
    assert _one(vl, kern, "rocm")[0] == 2
    # a module-level helper of rocm.py: the module is named only by rocm_platform_plugin, so on cuda it is
    # never imported; once code that runs everywhere imports it, it is kept
    gfx = _diff(vl, "vl/platforms/rocm.py", "return True", "return False", tmp_path / "g.diff")
    tier, why = _one(vl, gfx, "cuda")
    assert tier == 3 and "vl/platforms/rocm.py is only imported where platform cuda cannot go" in why[0]
    assert "named by rocm_platform_plugin (vl/platforms/__init__.py:6)" in why[0]
    (vl / "vl/layers/gfx.py").write_text("from vl.platforms.rocm import on_gfx9\n")
    assert _one(vl, gfx, "cuda")[0] == 2


def test_a_class_two_plugins_name_is_kept_for_both(vl: Path, tmp_path: Path) -> None:
    init = vl / "vl/platforms/__init__.py"
    init.write_text(
        init.read_text() + '\n\ndef xpu_platform_plugin() -> str | None:\n    return "vl.platforms.rocm.RocmPlatform"\n'
    )
    plat = _diff(vl, "vl/platforms/rocm.py", "rocm_attn.RocmBackend", "rocm_attn.RocmBackend2", tmp_path / "p.diff")
    assert _one(vl, plat, "xpu")[0] == 2
    assert _one(vl, plat, "cuda")[0] == 3


def test_an_unconditional_import_keeps_the_module(vl: Path, tmp_path: Path) -> None:
    (vl / "vl/layers/extra.py").write_text("from vl.ops.rocm_kernels import fused_rope\n")
    kern = _diff(vl, "vl/ops/rocm_kernels.py", "q * 2", "q * 3", tmp_path / "k.diff")
    assert _one(vl, kern, "cuda")[0] == 2


def test_a_module_named_in_a_bare_string_is_not_decided(vl: Path, tmp_path: Path) -> None:
    """A registry naming the module as a string (``("rocm_kernels", "fused_rope")``): a lookup the reading
    cannot place, so the module is kept."""
    (vl / "vl/layers/registry.py").write_text('_OPS = {"rope": ("rocm_kernels", "fused_rope")}\n')
    kern = _diff(vl, "vl/ops/rocm_kernels.py", "q * 2", "q * 3", tmp_path / "k.diff")
    assert _one(vl, kern, "cuda")[0] == 2


# -- the condition reading against brute force -------------------------------------------------------

# The truth of each predicate as the releases define it (written apart from the reader's tables):
# None where the platform leaves it open (an out-of-tree platform may be TPU or NPU's).
PLATFORMS = list(Platform)
VLLM_TRUTH = {
    "is_cuda": lambda p: p == "cuda",
    "is_rocm": lambda p: p == "rocm",
    "is_cpu": lambda p: p == "cpu",
    "is_xpu": lambda p: p == "xpu",
    "is_tpu": lambda p: p == "tpu",
    "is_cuda_alike": lambda p: p in ("cuda", "rocm"),
    "is_out_of_tree": lambda p: None if p in ("tpu", "npu") else False,
}
SGL_TRUTH = {
    "is_cuda": lambda p: p == "cuda",
    "is_hip": lambda p: p == "rocm",
    "is_cpu": lambda p: p == "cpu",
    "is_npu": lambda p: p == "npu",
    "is_cuda_alike": lambda p: p in ("cuda", "rocm"),
}
ATOMS = (
    [f"current_platform.{m}()" for m in VLLM_TRUTH]
    + [f"{f}()" for f in SGL_TRUTH]
    + ["_is_hip", "_is_cuda", "_use_aiter", "env_a", "env_b", "get_bool_env_var('X')"]
)
PRELUDE = (
    "from sgl.srt.utils import get_bool_env_var, is_cpu, is_cuda, is_cuda_alike, is_hip, is_npu\n"
    "from vl.platforms import current_platform\n"
    "_is_hip = is_hip()\n_is_cuda = is_cuda()\n_use_aiter = get_bool_env_var('SGLANG_USE_AITER') and _is_hip\n"
)


def _conditions() -> st.SearchStrategy[str]:
    leaf = st.sampled_from(ATOMS)
    return st.recursive(
        leaf,
        lambda sub: st.one_of(
            sub.map(lambda e: f"(not {e})"),
            st.tuples(sub, sub).map(lambda ab: f"({ab[0]} and {ab[1]})"),
            st.tuples(sub, sub).map(lambda ab: f"({ab[0]} or {ab[1]})"),
        ),
        max_leaves=6,
    )


def _brute(cond: str, platform: str) -> set[bool]:
    """Every truth ``cond`` can take on ``platform``: the predicates stubbed, each open value (an
    environment variable, an out-of-tree platform) enumerated."""
    opens = ["env_a", "env_b", "env_x", "env_aiter", "oot"]
    seen: set[bool] = set()
    for values in itertools.product([False, True], repeat=len(opens)):
        free = dict(zip(opens, values, strict=True))

        def vllm(name: str, free: dict[str, bool] = free) -> bool:
            v = VLLM_TRUTH[name](platform)
            return free["oot"] if v is None else bool(v)

        class CurrentPlatform:
            def __getattr__(self, name: str) -> object:
                return lambda: vllm(name)

        env = {
            "current_platform": CurrentPlatform(),
            **{f: (lambda f=f: SGL_TRUTH[f](platform)) for f in SGL_TRUTH},
            "get_bool_env_var": lambda _name, free=free: free["env_x"],
            "env_a": free["env_a"],
            "env_b": free["env_b"],
            "_is_hip": platform == "rocm",
            "_is_cuda": platform == "cuda",
            "_use_aiter": free["env_aiter"] and platform == "rocm",
        }
        seen.add(bool(eval(cond, env)))  # a generated condition over the stubs above
    return seen


@settings(max_examples=300, deadline=None)
@given(_conditions())
def test_condition_truth_matches_brute_force(cond: str) -> None:
    """The three-valued reading is sound (true or false only when every environment agrees) and, when each
    open value occurs once, exact (not decided only when the environment decides)."""
    mod = parse_module("m.py", PRELUDE + f"if {cond}:\n    pass\n")
    assert mod is not None
    reader = Conditions(mod)
    test = mod.tree.body[-1]
    assert isinstance(test, ast.If)
    opens = [a for a in ("env_a", "env_b", "get_bool_env_var", "_use_aiter", "is_out_of_tree") if a in cond]
    read_once = all(cond.count(a) <= 1 for a in opens) and not ("_use_aiter" in cond and "get_bool_env_var" in cond)
    for platform in PLATFORMS:
        got = reader.truth(test.test, platform)
        truths = _brute(cond, platform.value)
        if got is not None:
            assert truths == {got}, (cond, platform, got, truths)
        elif read_once:
            assert truths == {False, True}, (cond, platform, truths)


def test_a_local_that_hides_the_alias_and_a_test_on_no_platform_are_not_read() -> None:
    """``def f(_is_hip): if _is_hip:`` reads the parameter, not the module's alias; ``if False:`` is dead
    everywhere, which says nothing about a platform."""
    src = (
        "from u import is_hip\n_is_hip = is_hip()\n\n\ndef f(_is_hip):\n    if _is_hip:\n        return 1\n"
        "    if False:\n        return 2\n    if _is_hip_mod():\n        return 3\n\n\ndef g():\n    if _is_hip:\n"
        "        return 4\n"
    )
    mod = parse_module("m.py", src)
    assert mod is not None
    cond = Conditions(mod)
    assert [line_block(cond, "m.py", n, Platform.CUDA, {}) for n in (7, 9, 11)] == [None, None, None]
    b = line_block(cond, "m.py", 16, Platform.CUDA, {})
    assert b is not None and b.words == "under `if _is_hip:` (m.py:15), false on cuda: _is_hip = is_hip() (m.py:2)"


def test_a_name_bound_twice_or_in_a_block_is_not_an_alias() -> None:
    src = "from u import is_hip\n_a = is_hip()\n_a = True\nif x:\n    _b = is_hip()\n_b = is_hip()\n_c = is_hip()\n"
    mod = parse_module("m.py", src)
    assert mod is not None
    assert set(Conditions(mod).aliases) == {"_c"}


# -- where the user says it: --platform, [target] platform ------------------------------------------


def test_platform_is_parsed_once_with_the_key_in_the_error() -> None:
    assert Platform.parse("CUDA", "--platform") is Platform.CUDA
    assert Platform.parse("hip", "--platform") is Platform.ROCM
    with pytest.raises(UsageError, match=r"--platform 'gpu' is not a platform \(fix: write one of cuda, rocm"):
        Platform.parse("gpu", "--platform")
    with pytest.raises(ManifestError, match=r"target\.platform 3 is not a platform"):
        Platform.parse(3, "target.platform", ManifestError)


def test_isolates_manifest_reader_checks_the_same_key(tmp_path: Path) -> None:
    from speedtrap.manifest import parse_manifest

    def target(platform: object) -> dict[str, object]:
        return {
            "target": {"launch": ["srv", "--port", "{port}"], "platform": platform},
            "patches": [{"name": "p", "gate": "ungated"}],
            "verdict": {"bound": 0.1},
        }

    assert parse_manifest(target("ROCm"), tmp_path).target.platform is Platform.ROCM
    with pytest.raises(ManifestError, match=r"target\.platform 'amd' is not a platform \(fix: write one of cuda"):
        parse_manifest(target("amd"), tmp_path)


def test_cli_platform_flag_and_manifest_target(sgl: Path, tmp_path: Path) -> None:
    d = _diff(sgl, FP8, "x = x.contiguous()", "x = x.contiguous() * 1.5", tmp_path / "hip.diff")
    ok = CliRunner().invoke(app, ["triage", "--patch", str(d), "--tree", str(sgl), "--platform", "cuda", "--json"])
    assert ok.exit_code == 0, ok.output
    data = json.loads(ok.output)
    assert data["tiers"]["3"] == ["hip"]
    bad = CliRunner().invoke(app, ["triage", "--patch", str(d), "--tree", str(sgl), "--platform", "gpu"])
    assert bad.exit_code == 2
    assert "--platform 'gpu' is not a platform (fix: write one of cuda, rocm, cpu, xpu, tpu, npu)" in bad.output
    assert "Traceback" not in bad.output

    def manifest(platform: str) -> Path:
        path = tmp_path / f"m-{platform}.toml"
        path.write_text(
            f'tree = "sgl-tree"\n\n[target]\nlaunch = ["srv", "--port", "{{port}}"]\nplatform = "{platform}"\n\n'
            '[[patches]]\nname = "hip"\ndiff = "hip.diff"\ngate = "ungated"\n'
        )
        return path

    on_cuda = CliRunner().invoke(app, ["triage", "--manifest", str(manifest("cuda")), "--json"])
    assert on_cuda.exit_code == 0, on_cuda.output
    assert json.loads(on_cuda.output)["tiers"]["3"] == ["hip"]
    # the command line wins over the manifest
    on_rocm = CliRunner().invoke(app, ["triage", "--manifest", str(manifest("cuda")), "--platform", "rocm", "--json"])
    assert json.loads(on_rocm.output)["tiers"]["2"] == ["hip"]
    wrong = CliRunner().invoke(app, ["triage", "--manifest", str(manifest("amd")), "--json"])
    assert wrong.exit_code == 2
    assert "target.platform 'amd' is not a platform (fix: write one of cuda, rocm" in wrong.output
    assert "Traceback" not in wrong.output
