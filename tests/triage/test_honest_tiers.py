"""Tier 3 only for a change proven inert; every other change on a forward path is at least tier 2.

The tree is a trimmed copy of real serving code: the MoE block of SGLang 0.4.10's
``models/deepseek_v2.py`` (``final_hidden_states *= self.routed_scaling_factor``, the DeepEP
``x.add_(final_hidden_states, alpha=self.routed_scaling_factor)``), a kv-cache dtype choice as in
``model_runner.py`` and a buffer allocation. Each patch's effect is known by construction.
"""

from __future__ import annotations

import ast
import difflib
from pathlib import Path

import pytest

from speedtrap.triage import from_diff_files, triage
from speedtrap.triage.python.inert import inert

MODEL = """\
import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)


class DeepseekV2MoE(nn.Module):
    def __init__(self, config, layer_id):
        super().__init__()
        self.routed_scaling_factor = config.routed_scaling_factor
        self.layer_id = layer_id
        self.experts = nn.Linear(4, 4)

    def forward(self, hidden_states, shared_output, dtype):
        final_hidden_states = self.experts(hidden_states)
        if dtype == "bf16":
            final_hidden_states = final_hidden_states.float()
        logger.debug("moe layer %d", self.layer_id)
        if shared_output is not None:
            x = shared_output
            x.add_(final_hidden_states, alpha=self.routed_scaling_factor)
            final_hidden_states = x
        else:
            final_hidden_states *= self.routed_scaling_factor
        scale = self.routed_scaling_factor * 2.0
        assert scale > 0, "routed scaling must be positive"
        return final_hidden_states


class Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList([DeepseekV2MoE(config, i) for i in range(config.n)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x, None, "bf16")
        return x
"""

INERT = {
    "comment": [
        (
            "        final_hidden_states = self.experts(hidden_states)\n",
            "        # routed experts\n        final_hidden_states = self.experts(hidden_states)\n",
        )
    ],
    "docstring": [
        (
            "    def forward(self, hidden_states, shared_output, dtype):\n",
            '    def forward(self, hidden_states, shared_output, dtype):\n        """The MoE block."""\n',
        )
    ],
    "a docstring above the docstring": [
        (
            "    def forward(self, hidden_states, shared_output, dtype):\n",
            "    def forward(self, hidden_states, shared_output, dtype):\n"
            '        """Decoy docstring."""\n        """The MoE block: routed experts, then the shared output."""\n',
        )
    ],
    "a bare string or ellipsis statement": [
        (
            "        final_hidden_states = self.experts(hidden_states)\n",
            '        "routed experts first"\n        ...\n        final_hidden_states = self.experts(hidden_states)\n',
        )
    ],
    "log message": [
        ('logger.debug("moe layer %d", self.layer_id)', 'logger.info("MoE forward, layer %d", self.layer_id)')
    ],
    "assert message": [('"routed scaling must be positive"', '"bad routed_scaling_factor"')],
    "local rename": [
        (
            "            x = shared_output\n            x.add_(final_hidden_states, alpha=self.routed_scaling_factor)\n"
            "            final_hidden_states = x\n",
            "            out = shared_output\n"
            "            out.add_(final_hidden_states, alpha=self.routed_scaling_factor)\n"
            "            final_hidden_states = out\n",
        )
    ],
    "*= as mul_": [
        ("final_hidden_states *= self.routed_scaling_factor", "final_hidden_states.mul_(self.routed_scaling_factor)")
    ],
    "a*b as b*a": [("self.routed_scaling_factor * 2.0", "2.0 * self.routed_scaling_factor")],
    "== as in (c,)": [('if dtype == "bf16":', 'if dtype in ("bf16",):')],
    "formatting": [
        (
            "        final_hidden_states = self.experts(hidden_states)\n",
            "        final_hidden_states = self.experts(\n            hidden_states\n        )\n",
        )
    ],
}

NOT_INERT = {
    "another factor": [("final_hidden_states *= self.routed_scaling_factor", "final_hidden_states *= self.layer_id")],
    "a constant changed": [("self.routed_scaling_factor * 2.0", "self.routed_scaling_factor * 3.0")],
    "a log call with an effect": [
        ('logger.debug("moe layer %d", self.layer_id)', 'logger.debug("moe layer %d", self.experts.reset_parameters())')
    ],
    "a data-flow change under a rename": [
        ("            final_hidden_states = x\n", "            final_hidden_states = shared_output + 0\n")
    ],
    "mul_ to add_": [
        ("final_hidden_states *= self.routed_scaling_factor", "final_hidden_states.add_(self.routed_scaling_factor)")
    ],
}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "model.py").write_text(MODEL)
    return root


def _diff(tree: Path, edits: list[tuple[str, str]], out: Path, rel: str = "pkg/model.py") -> Path:
    before = (tree / rel).read_text()
    after = before
    for old, new in edits:
        assert after.count(old) == 1, old
        after = after.replace(old, new)
    assert after != before
    out.write_text(
        "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{rel}", f"b/{rel}"))
    )
    return out


@pytest.mark.parametrize("name", sorted(INERT))
def test_a_proven_inert_rewrite_is_tier_3_same_math(tree: Path, tmp_path: Path, name: str) -> None:
    [p] = triage(from_diff_files([_diff(tree, INERT[name], tmp_path / "p.diff")], tree)).patches
    assert p.tier == 3, (name, p.ranking.reasons)
    assert p.ranking.reasons[0].startswith("same math: every changed file is proven inert"), p.ranking.reasons
    assert not [s for s in p.signals.signals if s.kind in ("scale", "precision", "guard")]


@pytest.mark.parametrize("name", sorted(NOT_INERT))
def test_a_change_on_the_forward_path_is_never_same_math(tree: Path, tmp_path: Path, name: str) -> None:
    [p] = triage(from_diff_files([_diff(tree, NOT_INERT[name], tmp_path / "p.diff")], tree)).patches
    assert p.tier <= 2, (name, p.ranking.reasons)
    text = "\n".join(p.ranking.reasons)
    assert "same math" not in text
    if p.ranking.risk == 0:
        assert p.ranking.reasons[0].startswith(
            "no static signal: changes computation on the forward path; no known risky pattern matched: pkg/model.py:"
        )
        assert not p.ranking.signal


def test_the_mul_rewrite_inside_a_real_change_is_not_read_as_a_removed_multiply(tree: Path, tmp_path: Path) -> None:
    # `*=` rewritten as `mul_` next to an unrelated edit: the rewrite is not "removes a multiply".
    edits = [*INERT["*= as mul_"], *NOT_INERT["a constant changed"]]
    [p] = triage(from_diff_files([_diff(tree, edits, tmp_path / "p.diff")], tree)).patches
    removed = [s for s in p.signals.signals if s.kind == "scale" and s.data.get("change") == "removed"]
    assert removed == []


def test_bf16_comparison_rewrite_is_not_a_precision_change(tree: Path, tmp_path: Path) -> None:
    edits = [('if dtype == "bf16":', 'if dtype in ("bf16",) and hidden_states.dim() > 1:')]
    [p] = triage(from_diff_files([_diff(tree, edits, tmp_path / "p.diff")], tree)).patches
    assert not [s for s in p.signals.signals if s.kind == "precision"]
    assert p.tier == 2


def test_docs_only_is_tier_3_but_not_code(tree: Path, tmp_path: Path) -> None:
    (tree / "README.md").write_text("hello\n")
    diff = _diff(tree, [("hello\n", "hello, world\n")], tmp_path / "d.diff", "README.md")
    [p] = triage(from_diff_files([diff], tree)).patches
    assert p.tier == 3 and "documentation, not code" in p.ranking.reasons[0]


def test_a_binary_change_is_not_same_math(tree: Path, tmp_path: Path) -> None:
    (tree / "pkg" / "kernel.so").write_bytes(b"\x7fELF")
    diff = tmp_path / "bin.diff"
    diff.write_text(
        "diff --git a/pkg/kernel.so b/pkg/kernel.so\nindex 1111111..2222222 100644\n"
        "Binary files a/pkg/kernel.so and b/pkg/kernel.so differ\n"
    )
    [p] = triage(from_diff_files([diff], tree)).patches
    assert p.tier == 2 and "same math" not in "\n".join(p.ranking.reasons)
    assert "binary file: not read, so not proven inert" in p.ranking.reasons[0]


def test_the_text_of_a_log_call_that_computes_is_inert_but_not_its_arguments_or_directives() -> None:
    base = "import time\ndef f(started):\n"
    base += '    logger.info("warmed in %.3f ms", (time.perf_counter() - started) * 1000)\n'
    reworded = base.replace('"warmed in %.3f ms"', '"[decoy] warmed the kernel in %.3f ms"')
    assert inert(ast.parse(base), ast.parse(reworded)) is not None
    changed = [
        base.replace("%.3f", "%r"),  # another conversion: another method of the value runs
        base.replace("* 1000", "* 100"),  # the computed argument
        base.replace('"warmed in %.3f ms", ', '"warmed in %.3f ms %s", time.sleep(1), '),
    ]
    for text in changed:
        assert inert(ast.parse(base), ast.parse(text)) is None, text
    f_base = base.replace('"warmed in %.3f ms"', 'f"warmed {started}: %.3f"')
    assert inert(ast.parse(f_base), ast.parse(f_base.replace("warmed {started}:", "took {started} -"))) is not None
    assert inert(ast.parse(f_base), ast.parse(f_base.replace("{started}", "{started!r}"))) is None


RISKY = [
    ("            final_hidden_states = x\n", "            final_hidden_states = x * self.routed_scaling_factor\n")
]


def test_no_static_signal_is_said_where_there_is_no_evidence(tree: Path, tmp_path: Path) -> None:
    """A tier with evidence either way (a risky pattern, or proven inert) carries a signal; a change on the forward
    path that matches no pattern and is not proven inert says "no static signal" in its reason, the plan and JSON."""
    from speedtrap.triage import render_plan

    diffs = [
        _diff(tree, NOT_INERT["a constant changed"], tmp_path / "unknown.diff"),
        _diff(tree, INERT["comment"], tmp_path / "comment.diff"),
        _diff(
            tree,
            [
                (
                    "            final_hidden_states = x\n",
                    "            final_hidden_states = x * self.routed_scaling_factor\n",
                )
            ],
            tmp_path / "risky.diff",
        ),
    ]
    report = triage(from_diff_files(diffs, tree), "routed_scaling_factor")
    by = {p.name: p for p in report.patches}
    unknown, comment, risky = by["unknown"], by["comment"], by["risky"]
    assert unknown.tier == 2 and unknown.ranking.risk == 0 and not unknown.ranking.signal
    assert unknown.ranking.reasons[0].startswith("no static signal: ")
    assert unknown.ranking.to_json()["static_signal"] is False
    assert comment.tier == 3 and comment.ranking.signal  # proven inert: evidence
    assert (
        risky.ranking.risk > 0 and risky.ranking.signal and "no static signal" not in "\n".join(risky.ranking.reasons)
    )
    plan = render_plan(report)
    assert "`unknown` (no static signal)" in plan and "(Tier 2 (no static signal))" in plan
    assert "`risky` (no static signal)" not in plan
