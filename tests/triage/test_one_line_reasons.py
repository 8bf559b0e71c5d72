"""Reasons a person reads in one pass: in the text output of ``speedtrap triage`` on a representative set of trees
built here (a factor doubled through a MoE's dispatch and through a re-exported router, a change only another
platform selects, a C++ scale argument and a moved ``case``, a guard replaced by logic under a long condition),
no reason and no warning line is longer than ``LIMIT`` characters, and no flow says "via itself". The evidence
is below each headline, indented, and in the JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _triage_one import edit_diff, lay_tree
from test_cargs import SOURCE as CPP_ARGS
from test_cswitch import MOVED as CPP_MOVED
from test_cswitch import SOURCE as CPP_SWITCH
from test_dispatch import AFTER as MOE_AFTER
from test_dispatch import BEFORE as MOE_BEFORE
from test_dispatch import FILES as MOE
from test_flow import FILES as ROUTER
from test_flow import ROUTER_ARG
from test_platform import SGL
from typer.testing import CliRunner

from speedtrap.cli import app
from speedtrap.triage.wording import HEADLINE, split_reason

LIMIT = 200  # about a line a person reads in one pass; a headline aims at HEADLINE (160)

GUARDED = {
    "pkg/__init__.py": "",
    "pkg/attn.py": """\
        class Attention:
            def __init__(self, config):
                self.use_sliding_window_with_attention_sinks_and_fp8_kv_cache = config.sliding and config.sinks
                self.scale_factor = config.head_dim**-0.5

            def forward(self, q, k, v, layer_index_within_the_stack_for_this_attention, extremely_long_flag):
                assert not (
                    self.use_sliding_window_with_attention_sinks_and_fp8_kv_cache and extremely_long_flag
                ), "sliding windows with attention sinks and an fp8 kv cache are not implemented for this backend"
                if layer_index_within_the_stack_for_this_attention > 0 and extremely_long_flag and q.shape[0] > 64:
                    q = q * self.scale_factor
                return q @ k.T @ v
        """,
}


def _cases(tmp: Path) -> list[tuple[str, list[str]]]:
    """(name, triage arguments) for each tree and its patch(es)."""
    moe = lay_tree(tmp / "moe", MOE)
    router = lay_tree(tmp / "router", ROUTER)
    sgl = lay_tree(tmp / "sgl", SGL)
    guarded = lay_tree(tmp / "guarded", GUARDED)
    cpp = lay_tree(tmp / "cpp", {"src/llama-model.cpp": CPP_ARGS})
    switch = lay_tree(tmp / "switch", {"src/llama-model.cpp": CPP_SWITCH})
    fp8 = "sgl/srt/layers/fp8_utils.py"
    guard_edits = [
        (
            "        assert not (\n            self.use_sliding_window_with_attention_sinks_and_fp8_kv_cache and "
            'extremely_long_flag\n        ), "sliding windows with attention sinks and an fp8 kv cache are not '
            'implemented for this backend"\n',
            "",
        ),
        ("> 0 and extremely_long_flag and q.shape[0] > 64", "> 0 and q.shape[0] > 64"),
    ]
    diffs = {
        "m": edit_diff(moe, "pkg/model.py", [(MOE_BEFORE, MOE_AFTER)], tmp / "m.diff"),
        "r": edit_diff(router, "pkg/layer.py", [(ROUTER_ARG, "scale=factor")], tmp / "r.diff"),
        "p": edit_diff(sgl, fp8, [("return aiter_linear", "return aiter_linear if True else None")], tmp / "p.diff"),
        "g": edit_diff(guarded, "pkg/attn.py", guard_edits, tmp / "g.diff"),
        "c": edit_diff(cpp, "src/llama-model.cpp", [("1.0f/sqrtf(float(d))", "1.0f")], tmp / "c.diff"),
        "s": edit_diff(switch, "src/llama-model.cpp", [(CPP_SWITCH, CPP_MOVED)], tmp / "s.diff"),
    }
    return [
        ("moe dispatch", ["--patch", str(diffs["m"]), "--tree", str(moe), "--symbol", "routed_scaling_factor"]),
        ("router", ["--patch", str(diffs["r"]), "--tree", str(router), "--symbol", "factor"]),
        ("platform", ["--patch", str(diffs["p"]), "--tree", str(sgl), "--platform", "cpu"]),
        ("guard", ["--patch", str(diffs["g"]), "--tree", str(guarded)]),
        ("cpp scale", ["--patch", str(diffs["c"]), "--tree", str(cpp)]),
        ("cpp case", ["--patch", str(diffs["s"]), "--tree", str(switch)]),
    ]  # fmt: skip


def _said(text: str) -> list[str]:
    """The reasons and warnings of a text output: the lines a person reads first."""
    return [line for line in text.splitlines() if line.startswith(("    - ", "warning:"))]


def test_every_reason_and_warning_fits_in_one_line(tmp_path: Path) -> None:
    longest: dict[str, int] = {}
    for name, args in _cases(tmp_path):
        out = CliRunner().invoke(app, ["triage", *args])
        assert out.exit_code == 0, (name, out.output)
        said = _said(out.stdout)
        assert said, (name, out.stdout)
        longest[name] = max(len(line) for line in said)
        too_long = [line for line in said if len(line) > LIMIT]
        assert too_long == [], (name, too_long)
        assert "via itself" not in out.stdout, name
    # the set holds long reasons to cut: a warning (the two factor cases) and more than a headline's aim
    assert sum(n > HEADLINE // 2 for n in longest.values()) >= 4, longest


def test_the_evidence_is_below_each_headline_and_in_the_json(tmp_path: Path) -> None:
    _, args = _cases(tmp_path)[0]
    text = CliRunner().invoke(app, ["triage", *args]).stdout
    lines = text.splitlines()
    warning = next(i for i, line in enumerate(lines) if line.startswith("warning: possible double application"))
    below = [line for line in lines[warning + 1 : warning + 8] if line.startswith("    ")]
    assert any(line.startswith("    site (now reached): pkg/layers/kernels.py:") for line in below), below
    assert any(line.startswith("    flow: ") for line in below), below
    data = json.loads(CliRunner().invoke(app, ["triage", *args, "--json"]).stdout)
    [patch] = data["patches"]
    ranking = patch["ranking"]
    assert len(ranking["reason_evidence"]) == len(ranking["reasons"])
    assert any(ranking["reason_evidence"]), ranking  # a long reason's detail is kept, as lines
    assert all(d["lines"] and d["message"] for d in patch["double_applications"])


@pytest.mark.parametrize(
    "text",
    [
        "short and whole",
        "a; " * 80,
        "removes the guard `" + "x and " * 60 + "y` (pkg/a.py:3) with real logic: z drives new code at pkg/a.py:9",
        "not selectable on platform cuda: in f, which is only referred to where platform cuda cannot go (pkg/b.py:4: "
        "under `if current_platform.is_rocm():` (pkg/b.py:3), false on cuda)",
    ],
)
def test_a_split_reason_keeps_every_word_and_fits(text: str) -> None:
    head, lines = split_reason(text)
    assert len(head) <= HEADLINE
    whole = " ".join(text.split())
    if len(whole) <= HEADLINE:
        assert (head, lines) == (whole, ())
    else:  # nothing is lost: the first clause, cut, is kept whole as the first evidence line
        assert all(w in " ".join((head, *lines)) for w in whole.replace("`", " ").split() if len(w) < 40)
