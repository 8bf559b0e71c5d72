"""C-family call arguments read on tokens: the argument splitter against generated calls (the
arguments are known by construction), and an identity literal swapped with a scale-like expression
at a call argument as a scale signal, both ways; other argument changes are not that signal."""

from __future__ import annotations

from pathlib import Path

from _triage_one import changed_lines, triage_one_file
from hypothesis import given, settings
from hypothesis import strategies as st

from speedtrap.triage.cfamily.precision_request import precision_changes
from speedtrap.triage.cfamily.scale_argument import argument_changes, is_identity, is_scale_like
from speedtrap.triage.cfamily.statements import calls, statements
from speedtrap.triage.cfamily.tokens import tokens, tokens_at

SOURCE = """\
#include "llama-graph.h"

static ggml_tensor * attn(llm_graph_context * g, ggml_tensor * q, ggml_tensor * k, int d, int il) {
    ggml_tensor * cur = g->build_attn(inp, wo, NULL,
            q, k, NULL, NULL, 1.0f/sqrtf(float(d)), il);
    cur = ggml_scale(ctx, cur, 1.0f); // no-op scale
    return ggml_add(ctx, cur, q);
}
"""

atoms = st.sampled_from(["x", "d", "1.0f", "n_embd_head", "kq_scale", "NULL", "0", "2"])
layout = st.sampled_from(["", " ", "\n        ", " /* c */ "])


@st.composite
def exprs(draw: st.DrawFn, depth: int = 0) -> str:
    """A C expression as text: atoms, binary operators, casts and nested calls."""
    kind = draw(st.integers(0, 3 if depth < 2 else 0))
    if kind == 0:
        return draw(atoms)
    if kind == 1:
        op = draw(st.sampled_from(["*", "/", "+", "-"]))
        return f"{draw(exprs(depth + 1))}{draw(layout)}{op} {draw(exprs(depth + 1))}"
    if kind == 2:
        return f"({draw(exprs(depth + 1))})"
    args = draw(st.lists(exprs(depth + 1), min_size=0, max_size=3))
    return f"{draw(st.sampled_from(['sqrtf', 'f', 'g']))}({(',' + draw(layout)).join(args)})"


@settings(max_examples=200, deadline=None)
@given(st.lists(exprs(), min_size=1, max_size=6), st.data())
def test_the_splitter_finds_the_arguments_the_call_was_built_from(args: list[str], data: st.DataObject) -> None:
    sep = "," + data.draw(layout)
    text = f"int y = outer_call({sep.join(args)});\n"
    toks = tokens_at(text)
    assert toks is not None
    [stmt] = statements(toks)
    outer = next(c for c in calls(stmt) if c.name == "outer_call")
    assert len(outer.args) == len(args)
    for got, want in zip(outer.args, args, strict=True):
        assert [t for t, _ in got] == tokens(want)


def test_statements_end_outside_brackets_only() -> None:
    toks = tokens_at("for (i = 0; i < n; i++) { a(i); }\n#define K 1\nb(2);\n")
    assert toks is not None
    texts = [" ".join(t for t, _ in s) for s in statements(toks)]
    assert texts == ["for ( i = 0 ; i < n ; i ++ ) {", "a ( i ) ;", "}", "# define K 1", "b ( 2 ) ;"]


def test_identity_and_scale_like() -> None:
    def arg(text: str) -> tuple[tuple[str, int], ...]:
        return tuple((t, 1) for t in tokens(text) or [])

    for ident in ("1.0f", "1.0", "1", "1.f", "(1.0f)", "1.0e0f"):
        assert is_identity(arg(ident)), ident
    for not_ident in ("10", "1.5f", "0.1f", "x", "-1.0f"):
        assert not is_identity(arg(not_ident)), not_ident
    for scale in ("1.0f/sqrtf(float(d))", "kq_scale", "hparams.f_attention_scale", "a*b", "powf(x, 2)"):
        assert is_scale_like(arg(scale)), scale
    for plain in ("il", "n_embd_head", "*ptr", "NULL", "2"):
        assert not is_scale_like(arg(plain)), plain


def test_both_ways_and_not_other_changes() -> None:
    to_identity = SOURCE.replace("1.0f/sqrtf(float(d))", "1.0f")
    [c] = argument_changes(SOURCE, to_identity, *changed_lines(SOURCE, to_identity))
    assert (c.callee, c.index, c.change) == ("build_attn", 7, "factor replaced by identity")
    assert (c.before, c.after, c.old_line, c.new_line) == ("1.0f/sqrtf(float(d))", "1.0f", 5, 5)
    to_scale = SOURCE.replace("cur, 1.0f);", "cur, kq_scale);")
    [c] = argument_changes(SOURCE, to_scale, *changed_lines(SOURCE, to_scale))
    assert (c.callee, c.index, c.change, c.after) == ("ggml_scale", 2, "identity literal replaced", "kq_scale")
    # not this signal: another argument changed, a scale changed to another scale, a layout change
    for other in (
        SOURCE.replace("q, k, NULL", "k, q, NULL"),
        SOURCE.replace("1.0f/sqrtf(float(d))", "1.0f/sqrtf(float(2*d))"),
        SOURCE.replace("cur, 1.0f);", "cur, 2.0f);"),
        SOURCE.replace("NULL,\n            q", "NULL, q"),
    ):
        assert argument_changes(SOURCE, other, *changed_lines(SOURCE, other)) == []


def _triage_cpp(tmp_path: Path, after: str) -> tuple[int, tuple[str, ...]]:
    return triage_one_file(tmp_path, "src/llama-model.cpp", SOURCE, after)


def test_a_scale_replaced_by_the_identity_at_a_cpp_call_is_a_scale_signal_naming_the_line(tmp_path: Path) -> None:
    tier, reasons = _triage_cpp(tmp_path / "a", SOURCE.replace("1.0f/sqrtf(float(d))", "1.0f"))
    assert tier == 1
    assert "`1.0f/sqrtf(float(d))` by the identity `1.0f` at build_attn(argument 8)" in reasons[0]
    assert "src/llama-model.cpp:5" in reasons[0]
    # an argument swapped with no scale in play stays "changes computation", tier 2
    tier, reasons = _triage_cpp(tmp_path / "b", SOURCE.replace("q, k, NULL", "k, q, NULL"))
    assert tier == 2 and reasons[0].startswith("no static signal: changes computation on the forward path")
    # a comment next to the call stays proven inert
    tier, reasons = _triage_cpp(tmp_path / "c", SOURCE.replace("1.0f/sqrtf(float(d))", "1.0f/sqrtf(float(d)) /* s */"))
    assert tier == 3 and reasons[0].startswith("same math")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "1.0f", "(", ")", ";", '"s"', "b->c"]), layout), max_size=20))
def test_each_token_carries_the_line_it_starts_on(parts: list[tuple[str, str]]) -> None:
    text = "".join(tok + gap for tok, gap in parts)
    found = tokens_at(text)
    assert found is not None
    pos = 0
    for tok, line in found:  # brute force: the line of the token's first occurrence from here on
        pos = text.index(tok, pos)
        assert line == text.count("\n", 0, pos) + 1
        pos += len(tok)


PREC = """\
ggml_tensor * build(ggml_context * ctx0, ggml_tensor * k, ggml_tensor * q, int arch) {
    ggml_tensor * kq = ggml_mul_mat(ctx0, k, q);
    // F32: some models overflow in F16
    ggml_mul_mat_set_prec(kq, GGML_PREC_F32);
    return kq;
}
"""


def test_a_precision_request_removed_or_newly_conditioned_is_a_precision_signal(tmp_path: Path) -> None:
    removed = PREC.replace("    ggml_mul_mat_set_prec(kq, GGML_PREC_F32);\n", "")
    [c] = precision_changes(PREC, removed, *changed_lines(PREC, removed))
    assert (c.code, c.old_line, c.new_line) == ("ggml_mul_mat_set_prec(kq, GGML_PREC_F32)", 4, None)
    narrowed = PREC.replace(
        "    ggml_mul_mat_set_prec(kq, GGML_PREC_F32);\n",
        "    if (arch == LLM_ARCH_PHI2) {\n        ggml_mul_mat_set_prec(kq, GGML_PREC_F32);\n    }\n",
    )
    [c] = precision_changes(PREC, narrowed, *changed_lines(PREC, narrowed))
    assert c.conditions == ("if(arch==LLM_ARCH_PHI2){",) and c.new_line == 5
    # re-indented or commented, the request stays: nothing to say
    request = "    ggml_mul_mat_set_prec(kq, GGML_PREC_F32);\n"
    moved = PREC.replace(request, "  ggml_mul_mat_set_prec( kq, GGML_PREC_F32 ); // x\n")
    assert precision_changes(PREC, moved, *changed_lines(PREC, moved)) == []
    tier, reasons = _triage_source(tmp_path, PREC, removed)
    assert tier == 2
    assert reasons[0].startswith("removes the precision request `ggml_mul_mat_set_prec(kq, GGML_PREC_F32)`")


def _triage_source(tmp_path: Path, before: str, after: str) -> tuple[int, tuple[str, ...]]:
    return triage_one_file(tmp_path, "src/llama-graph.cpp", before, after)
