"""How often a changed C-family function runs: every layer when a loop over the layers calls it, directly
or through callers (read on tokens); no layer loop, no claim."""

from __future__ import annotations

import difflib
from pathlib import Path

from speedtrap.triage import from_diff_files, triage
from speedtrap.triage.cfamily.hot_loop import c_hot_path
from speedtrap.triage.flow.hot_path import EVERY_LAYER

GRAPH = """\
ggml_tensor * llm_graph_context::build_ffn(ggml_tensor * cur, ggml_tensor * down) {
    cur = build_lora_mm(down, cur);
    if (arch == LLM_ARCH_GLM4) {
        // F16 accumulators overflow here
        ggml_mul_mat_set_prec(cur, GGML_PREC_F32);
    }
    return cur;
}

ggml_tensor * llm_graph_context::build_block(ggml_tensor * cur, const llama_layer & layer) {
    return build_ffn(cur, layer.ffn_down);
}
"""
MODEL = """\
struct llm_build_glm4 : public llm_graph_context {
    llm_build_glm4(const llama_model & model, const llm_graph_params & params) : llm_graph_context(params) {
        ggml_tensor * cur = build_inp_embd(model.tok_embd);
        static const std::map<int, const char *> names = { {1, "a"}, {2, "b"} };
        for (int il = 0; il < n_layer; ++il) {
            cur = build_block(cur, model.layers[il]);
        }
        res->t_logits = cur;
    }
};
"""
REMOVED = GRAPH.replace(
    "    if (arch == LLM_ARCH_GLM4) {\n        // F16 accumulators overflow here\n"
    "        ggml_mul_mat_set_prec(cur, GGML_PREC_F32);\n    }\n",
    "",
)


def _tree(root: Path, model: str) -> None:
    (root / "src").mkdir(parents=True)
    (root / "src" / "llama-graph.cpp").write_text(GRAPH)
    (root / "src" / "llama-model.cpp").write_text(model)


def test_a_function_a_layer_loop_reaches_through_a_caller_runs_on_every_layer(tmp_path: Path) -> None:
    _tree(tmp_path, MODEL)
    hot = c_hot_path(tmp_path, "src/llama-graph.cpp", GRAPH, frozenset({3, 4, 5, 6}))
    assert hot is not None and hot.level == EVERY_LAYER
    assert hot.chain == ("build_ffn", "build_block", "llm_build_glm4 (layer loop in src/llama-model.cpp)")


def test_no_layer_loop_no_claim(tmp_path: Path) -> None:
    _tree(tmp_path, MODEL.replace("for (int il = 0; il < n_layer; ++il)", "if (true)"))
    assert c_hot_path(tmp_path, "src/llama-graph.cpp", GRAPH, frozenset({3, 4, 5, 6})) is None


def _triage(tmp_path: Path, model: str) -> int:
    root = tmp_path / "tree"
    _tree(root, model)
    rel = "src/llama-graph.cpp"
    diff = difflib.unified_diff(GRAPH.splitlines(True), REMOVED.splitlines(True), f"a/{rel}", f"b/{rel}")
    (tmp_path / "p.diff").write_text("".join(diff))
    [p] = triage(from_diff_files([tmp_path / "p.diff"], root)).patches
    return p.tier


def test_the_precision_request_removed_on_every_layer_is_tier_1_and_elsewhere_tier_2(tmp_path: Path) -> None:
    assert _triage(tmp_path / "a", MODEL) == 1
    assert _triage(tmp_path / "b", MODEL.replace("for (int il = 0; il < n_layer; ++il)", "if (true)")) == 2
