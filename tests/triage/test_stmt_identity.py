"""Statement-level identity selections (``if c: s = f`` / ``else: s = 1.0``, or a default overridden
under a condition) feeding a multiply: collapsed, re-conditioned or introduced by a patch.

Generated programs are run for every outcome of their conditions (brute force): a claim that the
factor is applied in more cases (or fewer) must hold on some outcome and never be contradicted,
and every patch that changes which outcomes apply the factor gets a claim."""

from __future__ import annotations

import difflib
import itertools
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from speedtrap.triage import PatchReport, from_diff_files, triage

TESTS = ["c1", "not c1", "c1 and c2", "c1 or c2", "c2"]
SHAPES = ["identity_else", "identity_body", "identity_default", "identity_override"]


def selection(shape: str, test: str) -> str:
    """The lines that set ``s`` (indented for a function body)."""
    if shape == "identity_else":
        return f"    if {test}:\n        s = f\n    else:\n        s = 1.0\n"
    if shape == "identity_body":
        return f"    if {test}:\n        s = 1.0\n    else:\n        s = f\n"
    if shape == "identity_default":
        return f"    s = 1.0\n    if {test}:\n        s = f\n"
    return f"    s = f\n    if {test}:\n        s = 1.0\n"


def program(body: str) -> str:
    return f"def scale(x, f, c1, c2):\n    y = x + 0.0\n{body}    return y * s\n"


def applied(source: str) -> dict[tuple[bool, bool], bool]:
    """For each outcome of (c1, c2): whether the result carries the factor (brute force)."""
    space: dict[str, object] = {}
    exec(compile(source, "<generated>", "exec"), space)  # generated test programs only
    fn: Callable[..., float] = space["scale"]  # type: ignore[assignment]
    return {(a, b): fn(2.0, 3.0, a, b) == 6.0 for a, b in itertools.product([False, True], repeat=2)}


def run(old: str, new: str) -> PatchReport:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "tree"
        (root / "pkg").mkdir(parents=True)
        (root / "pkg" / "__init__.py").write_text("")
        (root / "pkg" / "attn.py").write_text(old)
        diff = difflib.unified_diff(old.splitlines(True), new.splitlines(True), "a/pkg/attn.py", "b/pkg/attn.py")
        (Path(tmp) / "p.diff").write_text("".join(diff))
        [report] = triage(from_diff_files([Path(tmp) / "p.diff"], root)).patches
    return report


@st.composite
def patches(draw: st.DrawFn) -> tuple[str, str]:
    kind = draw(st.sampled_from(["collapse", "recondition", "introduce", "unrelated"]))
    shape, test = draw(st.sampled_from(SHAPES)), draw(st.sampled_from(TESTS))
    old = program(selection(shape, test))
    if kind == "collapse":
        new = program("    s = f\n")
    elif kind == "recondition":
        new = program(selection(shape, draw(st.sampled_from([t for t in TESTS if t != test]))))
    elif kind == "introduce":
        old, new = program("    s = f\n"), old
    else:
        new = old.replace("y = x + 0.0", "y = x + 0.0 * x")
    return old, new


@settings(max_examples=60, deadline=None)
@given(patches())
def test_claims_agree_with_brute_force(pair: tuple[str, str]) -> None:
    old, new = pair
    before, after = applied(old), applied(new)
    report = run(old, new)
    changes = [c for c in report.signals.identity if c.statement]
    kinds = {c.change for c in changes}
    more = any(after[o] and not before[o] for o in before)
    fewer = any(before[o] and not after[o] for o in before)
    if "identity removed" in kinds:
        assert more and all(after.values()), (old, new)
    if "identity added" in kinds:
        assert fewer and all(before.values()), (old, new)
    if more or fewer:  # the factor's cases changed: said, with the multiply named
        assert changes, (old, new)
        assert any("pkg/attn.py:" in m and "`return y * s`" in m for m in report.missing), report.missing
    for c in changes:
        assert c.reaches and c.reaches[0].site.code == "return y * s"


def test_the_collapse_is_tier_1_with_the_cases_named(tmp_path: Path) -> None:
    old = textwrap.dedent(
        """\
        def bmm1_scale(layer, kv_is_fp8, softmax_scale):
            q_scale = 1.0
            if kv_is_fp8:
                k_scale = layer.k_scale
            else:
                if layer.k_scale is not None:
                    print("ignoring k_scale")
                k_scale = 1.0
            return q_scale * k_scale * softmax_scale
        """
    )
    new = old.replace(
        "    if kv_is_fp8:\n        k_scale = layer.k_scale\n    else:\n"
        '        if layer.k_scale is not None:\n            print("ignoring k_scale")\n        k_scale = 1.0\n',
        "    k_scale = layer.k_scale\n",
    )
    report = run(old, new)
    assert report.tier == 1
    [warning] = report.missing
    assert warning.startswith("k_scale is applied in more cases now: before the patch `not kv_is_fp8` selected 1.0")
    assert "pkg/attn.py:4 (`return q_scale * k_scale * softmax_scale`)" in warning
    assert not report.doubles  # more cases, not a second multiply


def test_a_selection_whose_value_reaches_no_multiply_is_not_a_scale_change() -> None:
    old = program(selection("identity_else", "c1")).replace("return y * s", "return y + s")
    new = old.replace("    if c1:\n        s = f\n    else:\n        s = 1.0\n", "    s = f\n")
    report = run(old, new)
    assert not [c for c in report.signals.identity if c.statement]
    assert report.tier == 2  # still a change on the forward path, said without a pattern
