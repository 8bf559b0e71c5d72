"""C-family ``switch``: a case label moved to another group of cases (an architecture moved between the
RoPE-type lists of ``llama_model_rope_type``) is a selection change naming both outcomes; reordering
labels within a group, or a new label, is not a move."""

from __future__ import annotations

from pathlib import Path

from _triage_one import changed_lines, triage_one_file

from speedtrap.triage.cfamily.case_moved import case_moves

SOURCE = """\
#include "llama-model.h"

llama_rope_type llama_model_rope_type(const llama_model * model) {
    switch (model->arch) {
        // normal RoPE
        case LLM_ARCH_LLAMA:
        case LLM_ARCH_STARCODER:
        case LLM_ARCH_INTERNLM2:
            return LLAMA_ROPE_TYPE_NORM;

        // the pairs of head values are offset by n_rot/2
        case LLM_ARCH_QWEN2:
        case LLM_ARCH_PLAMO:
        case LLM_ARCH_GEMMA:
            return LLAMA_ROPE_TYPE_NEOX;

        case LLM_ARCH_UNKNOWN:
            GGML_ABORT("unknown architecture");
    }
    return LLAMA_ROPE_TYPE_NONE;
}

static void build(llm_arch arch) {
    switch (arch) {
        case LLM_ARCH_PLAMO:
            {
                build_plamo();
            } break;
        default:
            break;
    }
}
"""

MOVED = SOURCE.replace(
    "        case LLM_ARCH_STARCODER:\n        case LLM_ARCH_INTERNLM2:\n",
    "        case LLM_ARCH_STARCODER:\n        case LLM_ARCH_PLAMO:\n        case LLM_ARCH_INTERNLM2:\n",
).replace("        case LLM_ARCH_QWEN2:\n        case LLM_ARCH_PLAMO:\n", "        case LLM_ARCH_QWEN2:\n")


def test_a_label_moved_between_groups() -> None:
    [move] = case_moves(SOURCE, MOVED, *changed_lines(SOURCE, MOVED))
    assert move.label == "LLM_ARCH_PLAMO"
    assert move.switch == "switch (model->arch) in llama_model_rope_type"
    assert (move.before, move.after) == ("return LLAMA_ROPE_TYPE_NEOX", "return LLAMA_ROPE_TYPE_NORM")


def test_a_move_ranks_tier_1_with_both_outcomes(tmp_path: Path) -> None:
    tier, reasons = triage_one_file(tmp_path, "src/llama-model.cpp", SOURCE, MOVED)
    assert tier == 1
    assert "moves `case LLM_ARCH_PLAMO:` of switch (model->arch) in llama_model_rope_type" in reasons[0]
    assert "`return LLAMA_ROPE_TYPE_NEOX` to those that `return LLAMA_ROPE_TYPE_NORM`" in reasons[0]


def test_labels_reordered_within_a_group_or_added_are_no_move() -> None:
    reordered = SOURCE.replace(
        "        case LLM_ARCH_QWEN2:\n        case LLM_ARCH_PLAMO:\n",
        "        case LLM_ARCH_PLAMO:\n        case LLM_ARCH_QWEN2:\n",
    )
    assert case_moves(SOURCE, reordered, *changed_lines(SOURCE, reordered)) == []
    added = SOURCE.replace(
        "        case LLM_ARCH_GEMMA:\n", "        case LLM_ARCH_GEMMA:\n        case LLM_ARCH_GEMMA2:\n"
    )
    assert case_moves(SOURCE, added, *changed_lines(SOURCE, added)) == []
