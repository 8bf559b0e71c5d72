"""The seven classes of risky change, each read off a diff with its lines, on trimmed copies of real
serving code (SGLang 0.4.10 / vLLM shapes named per test). What each patch does is known by
construction; the decoy next to each is a change of the same file that must not raise the signal."""

from __future__ import annotations

import difflib
from pathlib import Path

from _triage_one import lay_tree

from speedtrap.triage import PatchReport, from_diff_files, triage

# A FusedMoE whose forward applies the factor it is given (vLLM's FusedMoE(routed_scaling_factor=...)),
# and a model block that also multiplies by it after the experts (deepseek_v2.py's `*=`).
FILES = {
    "pkg/__init__.py": "",
    "pkg/fused_moe.py": """\
        import torch
        from torch import nn


        class FusedMoE(nn.Module):
            def __init__(self, num_experts, top_k, routed_scaling_factor=1.0, quant_method=None):
                super().__init__()
                self.routed_scaling_factor = routed_scaling_factor
                self.quant_method = quant_method
                self.w13 = torch.zeros(num_experts, 4)

            def forward(self, hidden_states, topk_weights):
                topk_weights = topk_weights * self.routed_scaling_factor
                return self.quant_method.apply(self, hidden_states, topk_weights)


        class Fp8MoEMethod:
            def apply(self, layer, x, topk_weights):
                out = x @ layer.w13.t()
                return out
        """,
    "pkg/model.py": """\
        import torch
        from torch import nn

        from pkg.fused_moe import FusedMoE

        SUPPORTED_KV_DTYPES = ["auto", "fp8_e5m2"]
        _supports_fp8_kv = ("llama", "qwen2")


        class DeepseekV2MoE(nn.Module):
            def __init__(self, config, layer_id):
                super().__init__()
                self.routed_scaling_factor = config.routed_scaling_factor
                self.experts = FusedMoE(
                    num_experts=config.n_routed_experts,
                    top_k=config.top_k,
                    routed_scaling_factor=1.0,
                )

            def forward(self, hidden_states, topk_weights):
                final_hidden_states = self.experts(hidden_states, topk_weights)
                final_hidden_states *= self.routed_scaling_factor
                return final_hidden_states


        class DecoderLayer(nn.Module):
            def __init__(self, config, layer_id):
                super().__init__()
                self.mlp = DeepseekV2MoE(config, layer_id)
                self.scale_depth = config.scale_depth
                self.num_layers = config.num_hidden_layers

            def forward(self, hidden_states, residual, topk_weights):
                out = self.mlp(hidden_states, topk_weights)
                hidden_states = residual + out * (self.scale_depth / self.num_layers)
                return hidden_states


        class Model(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.layers = nn.ModuleList([DecoderLayer(config, i) for i in range(config.n)])
                self.embed_scale = config.embed_scale

            def forward(self, x, topk_weights):
                for layer in self.layers:
                    x = layer(x, x, topk_weights)
                x = x * self.embed_scale
                return x


        def choose_kv_cache_dtype(server_args, model_arch):
            kv_cache_dtype = server_args.dtype
            if server_args.kv_cache_dtype == "fp8_e5m2" and model_arch in _supports_fp8_kv:
                kv_cache_dtype = "fp8_e5m2"
            return kv_cache_dtype


        def can_use_flashinfer(head_dim, is_cuda, sm):
            return is_cuda and head_dim in (64, 128) and sm >= 80
        """,
    "pkg/cuda_graph_runner.py": """\
        import torch


        def is_in_piecewise_cuda_graph():
            return False


        class CudaGraphRunner:
            def __init__(self, max_bs):
                self.max_bs = max_bs
                self.input_ids = torch.zeros(max_bs, dtype=torch.int64)
                self.out_cache_loc = torch.zeros(max_bs, dtype=torch.int64)

            def replay(self, forward_batch):
                bs = forward_batch.batch_size
                self.input_ids[:bs].copy_(forward_batch.input_ids)
                return self.input_ids

            def prepare(self, x):
                if is_in_piecewise_cuda_graph():
                    return x.clone()
                return x
        """,
}


def _tree(tmp_path: Path) -> Path:
    return lay_tree(tmp_path / "tree", FILES)


def _one(tmp_path: Path, rel: str, edits: list[tuple[str, str]], symbol: str | None = None) -> PatchReport:
    tree = tmp_path / "tree"
    if not tree.exists():
        _tree(tmp_path)
    before = (tree / rel).read_text()
    after = before
    for old, new in edits:
        assert after.count(old) == 1, old
        after = after.replace(old, new)
    diff = tmp_path / f"p{len(list(tmp_path.glob('p*.diff')))}.diff"
    diff.write_text(
        "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{rel}", f"b/{rel}"))
    )
    [p] = triage(from_diff_files([diff], tree), symbol).patches
    return p


def _kinds(p: PatchReport) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for s in p.signals.signals:
        out.setdefault(s.kind, []).append(s.summary)
    return out


def test_1_identity_literal_replaced_by_the_factor_in_a_fused_moe_call(tmp_path: Path) -> None:
    p = _one(
        tmp_path, "pkg/model.py", [("routed_scaling_factor=1.0,", "routed_scaling_factor=self.routed_scaling_factor,")]
    )
    assert p.tier == 1
    [sig] = [s for s in p.signals.signals if s.data.get("change") == "identity literal replaced"]
    assert sig.data["factor"] == "routed_scaling_factor"
    assert [e.render().split(" ")[0] for e in sig.evidence][:2] == ["pkg/model.py:17", "pkg/model.py:17"]
    [reach] = sig.data["reaches"]
    assert reach["multiply"]["file"] == "pkg/fused_moe.py" and reach["multiply"]["line"] == 13
    # the double application names both sites: the callee's multiply and the block's `*=`.
    assert p.doubles, p.ranking.reasons
    d = p.doubles[0]
    assert {d.added.where, d.other.where} == {"pkg/fused_moe.py:13", "pkg/model.py:22"}, d.message


def test_1_reverse_factor_replaced_by_identity_names_what_still_applies_it(tmp_path: Path) -> None:
    _tree(tmp_path)
    p = _one(
        tmp_path, "pkg/model.py", [("routed_scaling_factor=1.0,", "routed_scaling_factor=self.routed_scaling_factor,")]
    )
    assert p.tier == 1
    # the reverse, on the fixed tree: the factor no longer reaches the fused multiply, the block still applies it.
    fixed = tmp_path / "tree" / "pkg" / "model.py"
    fixed.write_text(
        fixed.read_text().replace("routed_scaling_factor=1.0,", "routed_scaling_factor=self.routed_scaling_factor,")
    )
    q = _one(
        tmp_path,
        "pkg/model.py",
        [("routed_scaling_factor=self.routed_scaling_factor,\n        )", "routed_scaling_factor=1.0,\n        )")],
    )
    assert any(s.data.get("change") == "factor replaced by identity" for s in q.signals.signals)
    assert q.missing and "pkg/fused_moe.py:13" in q.missing[0] and "pkg/model.py:22" in q.missing[0]


def test_2_factor_reaching_a_kernel_through_layer_attr_in_quant_method_apply(tmp_path: Path) -> None:
    p = _one(
        tmp_path,
        "pkg/fused_moe.py",
        [
            (
                "        out = x @ layer.w13.t()\n",
                "        out = x @ layer.w13.t()\n        out.mul_(layer.routed_scaling_factor)\n",
            )
        ],
        "routed_scaling_factor",
    )
    scale = _kinds(p).get("scale", [])
    assert any("adds a multiply by routed_scaling_factor in Fp8MoEMethod.apply" in s for s in scale), scale
    assert p.tier == 1


def test_2_in_place_alpha_of_add_is_an_application(tmp_path: Path) -> None:
    p = _one(
        tmp_path,
        "pkg/model.py",
        [
            (
                "        final_hidden_states *= self.routed_scaling_factor\n",
                "        final_hidden_states.add_(hidden_states, alpha=self.routed_scaling_factor)\n",
            )
        ],
    )
    assert any("routed_scaling_factor" in s for s in _kinds(p).get("scale", []))


def test_2_factor_newly_passed_to_a_call(tmp_path: Path) -> None:
    p = _one(
        tmp_path,
        "pkg/fused_moe.py",
        [
            (
                "return self.quant_method.apply(self, hidden_states, topk_weights)",
                "return self.quant_method.apply(self, hidden_states, topk_weights, scale=self.routed_scaling_factor)",
            )
        ],
    )
    assert any(s.data.get("change") == "factor newly passed" for s in p.signals.signals)
    assert p.tier <= 2


def test_3_per_layer_residual_rescale(tmp_path: Path) -> None:
    # MiniCPM-style `residual + out * (scale_depth / n)` dropped: the rescale no longer runs per layer.
    p = _one(tmp_path, "pkg/model.py", [("residual + out * (self.scale_depth / self.num_layers)", "residual + out")])
    assert any("scale_depth" in s for s in _kinds(p).get("scale", []))
    assert p.tier == 1
    # moved into the layer loop: once per layer instead of once.
    q = _one(
        tmp_path,
        "pkg/model.py",
        [
            (
                "            x = layer(x, x, topk_weights)\n        x = x * self.embed_scale\n",
                "            x = layer(x, x, topk_weights)\n            x = x * self.embed_scale\n",
            )
        ],
    )
    assert any("how many times" in s and "once per iteration" in s for s in _kinds(q).get("scale", [])), _kinds(q)


def test_4_empty_replacing_zeros(tmp_path: Path) -> None:
    p = _one(
        tmp_path,
        "pkg/cuda_graph_runner.py",
        [
            (
                "self.out_cache_loc = torch.zeros(max_bs, dtype=torch.int64)",
                "self.out_cache_loc = torch.empty(max_bs, dtype=torch.int64)",
            )
        ],
    )
    [mem] = _kinds(p)["memory"]
    assert "empty where it used zeros" in mem and "CudaGraphRunner.__init__" in mem
    assert p.tier <= 2
    # the reverse (zeros where it used empty) is not an uninitialised-memory signal.
    _tree(tmp_path / "r")
    q = _one(tmp_path / "r", "pkg/fused_moe.py", [("torch.zeros(num_experts, 4)", "torch.ones(num_experts, 4)")])
    assert "memory" not in _kinds(q)


def test_5_supports_list_and_predicate_widened(tmp_path: Path) -> None:
    p = _one(
        tmp_path,
        "pkg/model.py",
        [('_supports_fp8_kv = ("llama", "qwen2")', '_supports_fp8_kv = ("llama", "qwen2", "deepseek_v2")')],
    )
    [g] = [s for s in p.signals.signals if s.data.get("widened")]
    assert "widens `_supports_fp8_kv`" in g.summary and "deepseek_v2" in g.summary
    q = _one(
        tmp_path,
        "pkg/model.py",
        [("return is_cuda and head_dim in (64, 128) and sm >= 80", "return is_cuda and head_dim in (64, 128)")],
    )
    assert any("drops a condition from" in s for s in _kinds(q).get("guard", []))
    r = _one(tmp_path, "pkg/model.py", [("head_dim in (64, 128) and", "head_dim in (64, 128, 256) and")])
    assert any("widens `head_dim in`" in s for s in _kinds(r).get("guard", []))
    # a narrowed list is not a widening
    s_ = _one(tmp_path, "pkg/model.py", [('_supports_fp8_kv = ("llama", "qwen2")', '_supports_fp8_kv = ("llama",)')])
    assert not [s for s in s_.signals.signals if s.data.get("widened")]


def test_6_cuda_graph_buffers_and_piecewise_branch(tmp_path: Path) -> None:
    p = _one(
        tmp_path,
        "pkg/cuda_graph_runner.py",
        [
            (
                "        self.input_ids[:bs].copy_(forward_batch.input_ids)\n        return self.input_ids\n",
                "        self.input_ids = torch.zeros(bs, dtype=torch.int64)\n"
                "        self.input_ids.copy_(forward_batch.input_ids)\n"
                "        return self.input_ids\n",
            )
        ],
    )
    [g] = _kinds(p)["cuda_graph"]
    assert "allocates a buffer (zeros) in replay" in g
    q = _one(
        tmp_path,
        "pkg/cuda_graph_runner.py",
        [("        if is_in_piecewise_cuda_graph():\n            return x.clone()\n", "")],
    )
    assert any("removes the branch `if is_in_piecewise_cuda_graph()`" in s for s in _kinds(q)["cuda_graph"])
    assert p.tier <= 2 and q.tier <= 2


def test_7_dtype_assignment_is_precision_a_comparison_is_not(tmp_path: Path) -> None:
    # the condition widened around an unchanged `kv_cache_dtype = "fp8_e5m2"`
    p = _one(
        tmp_path,
        "pkg/model.py",
        [
            (
                'if server_args.kv_cache_dtype == "fp8_e5m2" and model_arch in _supports_fp8_kv:',
                'if server_args.kv_cache_dtype == "fp8_e5m2":',
            )
        ],
    )
    assert any("precision set to fp8_e5m2 under a changed condition" in s for s in _kinds(p).get("precision", []))
    # a comparison against a dtype string and an allocation dtype are not precision changes
    q = _one(
        tmp_path,
        "pkg/model.py",
        [
            (
                "kv_cache_dtype = server_args.dtype\n",
                'kv_cache_dtype = server_args.dtype\n    assert kv_cache_dtype != "fp8_e4m3"\n',
            )
        ],
    )
    assert "precision" not in _kinds(q)
    r = _one(
        tmp_path,
        "pkg/cuda_graph_runner.py",
        [
            (
                "torch.zeros(max_bs, dtype=torch.int64)\n        self.out",
                "torch.zeros(max_bs, dtype=torch.bfloat16)\n        self.out",
            )
        ],
    )
    assert "precision" not in _kinds(r)
    # an assignment is
    s_ = _one(tmp_path, "pkg/model.py", [("kv_cache_dtype = server_args.dtype\n", 'kv_cache_dtype = "fp8_e4m3"\n')])
    assert "precision" in _kinds(s_)


def test_5_a_conjunct_lost_inside_an_alternative_by_a_diff_that_only_deletes_lines(tmp_path: Path) -> None:
    """sglang#31762's shape, written here: the exclusion inside the second alternative of a multi-line
    predicate is deleted (no added line), so the predicate holds in more cases."""
    predicate = (
        "\n\ndef fuses_in_topk(method, backend):\n"
        "    return (\n"
        "        getattr(method, 'fused', False)\n"
        "        or (\n"
        "            isinstance(method, int)\n"
        "            and (backend is None or not backend.is_marlin())\n"
        "        )\n"
        "    )\n"
    )
    _tree(tmp_path)
    model = tmp_path / "tree" / "pkg" / "model.py"
    model.write_text(model.read_text() + predicate)
    p = _one(
        tmp_path,
        "pkg/model.py",
        [
            (
                "            isinstance(method, int)\n            and (backend is None or not backend.is_marlin())\n",
                "            isinstance(method, int)\n",
            )
        ],
    )
    [g] = [s for s in p.signals.signals if s.data.get("widened")]
    assert "drops a condition from" in g.summary and "fuses_in_topk" in g.summary
    assert [e.side for e in g.evidence] == ["-"] and "is_marlin" in g.evidence[0].text
    # the reverse (the exclusion added back) narrows the predicate: no widening
    q = _one(
        tmp_path,
        "pkg/model.py",
        [
            (
                "    return (\n        getattr(method, 'fused', False)\n",
                "    return (\n        getattr(method, 'fused', False)\n        and backend is not None\n",
            )
        ],
    )
    assert not [s for s in q.signals.signals if s.data.get("widened")]


def test_a_keyword_argument_dropped_from_a_call_that_stays(tmp_path: Path) -> None:
    """sglang#38963's shape: an argument deleted from a call; the callee silently takes its default."""
    p = _one(tmp_path, "pkg/model.py", [("            top_k=config.top_k,\n", "")])
    [g] = [s for s in p.signals.signals if s.data.get("argument")]
    assert "drops `top_k=config.top_k` from the call `FusedMoE(...)`" in g.summary
    assert p.tier <= 2 and g.summary in p.ranking.reasons
    assert "no known risky pattern matched" not in p.ranking.reasons[0]
    # the same argument moved to another line of the call, or passed positionally instead: not dropped
    q = _one(
        tmp_path,
        "pkg/model.py",
        [
            (
                "            top_k=config.top_k,\n            routed_scaling_factor=1.0,\n",
                "            routed_scaling_factor=1.0, top_k=config.top_k,\n",
            )
        ],
    )
    assert not [s for s in q.signals.signals if s.data.get("argument")]
    r = _one(
        tmp_path,
        "pkg/model.py",
        [
            (
                "            num_experts=config.n_routed_experts,\n            top_k=config.top_k,\n",
                "            config.n_routed_experts,\n            config.top_k,\n",
            )
        ],
    )
    assert not [s for s in r.signals.signals if s.data.get("argument")]
