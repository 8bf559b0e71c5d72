"""C-family files: a comment or layout change is proven inert (tier 3, "same math"); a change of
any token, a string that merely looks like a comment, or a directive's line end is not."""

from __future__ import annotations

from pathlib import Path

from _triage_one import triage_one_file
from hypothesis import given, settings
from hypothesis import strategies as st

from speedtrap.triage.cfamily.tokens import inert_c, tokens

SOURCE = """\
#include "llama-graph.h"
#define KQ_SCALE(d) (1.0f/sqrtf(float(d)))

static ggml_tensor * attn(ggml_context * ctx, ggml_tensor * q, int d) {
    const char * name = "kq // not a comment";
    return ggml_scale(ctx, q, KQ_SCALE(d)); /* scaled once */
}
"""

pieces = st.sampled_from(["x", "y1", "2.0f", "+", "*", "(", ")", ";", "ggml_scale", '"s/*t*/"', "'a'", "->"])
layout = st.sampled_from([" ", "  ", "\n", "\t", " /* c */ ", " // c\n", "\n\n"])


@settings(max_examples=200, deadline=None)
@given(st.lists(pieces, min_size=1, max_size=12), st.data())
def test_comments_and_layout_between_tokens_are_inert(toks: list[str], data: st.DataObject) -> None:
    plain = " ".join(toks)
    spaced = "".join(t + data.draw(layout) for t in toks)
    assert tokens(plain) is not None
    assert inert_c(plain, spaced) is not None


@settings(max_examples=200, deadline=None)
@given(st.lists(pieces, min_size=1, max_size=12), st.data())
def test_a_changed_token_is_never_inert(toks: list[str], data: st.DataObject) -> None:
    i = data.draw(st.integers(0, len(toks) - 1))
    other = data.draw(pieces.filter(lambda p: p != toks[i]))
    changed = [*toks[:i], other, *toks[i + 1 :]]
    assert inert_c(" ".join(toks), " ".join(changed)) is None


def test_strings_and_directives() -> None:
    assert inert_c(SOURCE, SOURCE.replace("/* scaled once */", "// scaled once")) is not None
    assert inert_c(SOURCE, SOURCE.replace('"kq // not a comment"', '"kq // not a Comment"')) is None
    # a directive ends at its line end: joining the next line into it changes the program
    assert inert_c("#define A 1\nint x;\n", "#define A 1 int x;\n") is None
    assert inert_c("#define A 1\nint x;\n", "#define A 1 /* c */\nint   x;\n") is not None
    assert inert_c('auto s = R"(a // b)";', 'auto s = R"(a // c)";') is None  # raw strings: not read
    assert inert_c("p->x = 1;", "p- >x = 1;") is None  # operators are not split
    assert tokens("a->b") == ["a", "->", "b"]


def _triage_cpp(tmp_path: Path, after: str) -> tuple[int, tuple[str, ...]]:
    return triage_one_file(tmp_path, "src/llama-model.cpp", SOURCE, after)


def test_a_cpp_comment_is_tier_3_and_a_cpp_change_is_not(tmp_path: Path) -> None:
    tier, reasons = _triage_cpp(tmp_path / "a", SOURCE.replace("    return ggml", "    // decoy\n    return ggml"))
    assert tier == 3 and reasons[0].startswith("same math")
    tier, reasons = _triage_cpp(tmp_path / "b", SOURCE.replace("KQ_SCALE(d));", "1.0f);"))
    assert tier <= 2 and not any(r.startswith("same math") for r in reasons)
