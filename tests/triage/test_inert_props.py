"""Properties of the inertness proof on generated programs: equal rewrites (commuted products, ``*=`` as
``mul_``, a renamed local, a comment) are proven inert; changing one constant never is."""

from __future__ import annotations

import ast

from hypothesis import given, settings
from hypothesis import strategies as st

from speedtrap.triage.python.inert import inert

NAMES = ["a", "b", "self.scale", "x"]


@st.composite
def products(draw: st.DrawFn) -> list[str]:
    return draw(st.lists(st.sampled_from([*NAMES, "2.0", "3"]), min_size=2, max_size=5))


def _program(factors: list[str], local: str, inplace: bool, comment: bool) -> str:
    update = f"    out.mul_({local})\n" if inplace else f"    out *= {local}\n"
    return (
        "def f(a, b, x, out, self):\n"
        + ("    # a comment\n" if comment else "")
        + f"    {local} = {' * '.join(factors)}\n"
        + update
        + f"    return out + {local}\n"
    )


@settings(max_examples=150, deadline=None)
@given(products(), st.sampled_from(["t", "tmp", "scale_", "v"]), st.booleans())
def test_equal_rewrites_are_proven_inert(factors: list[str], local: str, inplace: bool) -> None:
    # (f0 * f1 * ... * fn-1) * fn  ->  fn * (f0 * ... * fn-1): the two operands of the last product swapped
    swapped = [f"{factors[-1]} * ({' * '.join(factors[:-1])})"]
    old = ast.parse(_program(factors, "t", False, False))
    new = ast.parse(_program(swapped, local, inplace, True))
    assert inert(old, new) is not None


def test_a_regrouped_product_is_not_proven_inert() -> None:
    # (a * b) * c and a * (b * c) round differently in floating point
    old = ast.parse("def f(a, b, c):\n    return a * b * c\n")
    new = ast.parse("def f(a, b, c):\n    return a * (b * c)\n")
    assert inert(old, new) is None


@settings(max_examples=150, deadline=None)
@given(products(), st.integers(min_value=0, max_value=4), st.booleans())
def test_a_changed_constant_or_operand_is_never_inert(factors: list[str], at: int, inplace: bool) -> None:
    i = at % len(factors)
    changed = list(factors)
    changed[i] = "7.5" if factors[i] != "7.5" else "8.5"
    old = ast.parse(_program(factors, "t", inplace, False))
    new = ast.parse(_program(changed, "t", inplace, False))
    assert inert(old, new) is None
    # a different data flow under a rename: the local no longer feeds the return
    flow = ast.parse(_program(factors, "t", inplace, False).replace("return out + t", "return out + a"))
    assert inert(old, flow) is None
