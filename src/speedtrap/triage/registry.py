"""Every rule triage reads a patch with, in one list: the signal it raises, what raises it, its module (whose
docstring holds the example it catches, after ``Catches::``) and its tests. ``docs/triage.md``'s table of
signals is generated from it (``signal_table``); ``tests/triage/test_registry.py`` fails when a rule module is
missing from the list, or the table in the docs is stale.

The modules of the rule folders that are not rules (they read code for the rules) are listed in ``READERS``.
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass

RULE_FOLDERS = ("python", "cfamily", "flow", "platform")
TABLE_BEGIN = "<!-- signal table: generated from speedtrap.triage.registry (signal_table); do not edit by hand -->"
TABLE_END = "<!-- end of the signal table -->"


@dataclass(frozen=True)
class Rule:
    """One rule: ``name`` as the table says it, ``signal`` the kind it raises, ``module`` under
    ``speedtrap.triage``, what raises it, and the test files that check it."""

    name: str
    signal: str
    module: str
    raises: str
    tests: tuple[str, ...]

    @property
    def path(self) -> str:
        return "src/speedtrap/triage/" + self.module.replace(".", "/") + ".py"

    def docstring(self) -> str:
        return importlib.import_module(f"speedtrap.triage.{self.module}").__doc__ or ""

    def example(self) -> str:
        """The first literal block of the module's docstring (the example it catches), one line."""
        lines = self.docstring().split("\n")
        start = next((i for i, line in enumerate(lines) if line.rstrip().endswith("::")), None)
        if start is None:
            return ""
        block: list[str] = []
        for line in lines[start + 1 :]:
            if line.strip() and not line.startswith("    "):
                break
            if line.strip():
                block.append(line.strip())
        parts = [" -> ".join(f"`{p.strip()}`" for p in line.split("   ->   ")) for line in block]
        return "; ".join(parts)


RULES: tuple[Rule, ...] = (
    Rule(
        "guard removed",
        "guard",
        "python.guard_removed",
        "`assert`, `raise NotImplementedError`, `if ...: raise` removed (more when replaced by logic)",
        ("tests/triage/test_change_classes.py",),
    ),
    Rule(
        "selection widened or narrowed",
        "guard",
        "python.selection_changed",
        "a `_supports_*` / `*_SUPPORTED` / membership collection gains members; a condition of an `if`/`while` or a "
        "returned predicate **strictly wider** (the old one implies the new and not the reverse, read on the "
        "`and`/`or` tree, atoms compared as ASTs: `a or (b and c)` -> `a or b` counts) or strictly **narrower** (an "
        "alternative dropped, a conjunct added: the cases it no longer covers take the other path), found in the "
        "changed functions even when the diff only deletes lines; an `if` on a support/capability predicate removed",
        ("tests/triage/test_change_classes.py", "tests/triage/test_narrowed.py", "tests/triage/test_exclusive.py"),
    ),
    Rule(
        "scale",
        "scale",
        "python.scale_changed",
        "a multiply/divide by a factor-like name, or by a normaliser (a root or inverse power: `hidden_size**-0.5`, "
        "`1.0 / (d ** 0.5)`, `torch.rsqrt(v)`, named by its text), added, removed, moved, re-guarded, or moved "
        "into/out of a loop; in-place forms `mul_`, `div_`, `torch.mul`, `alpha=` of `add_`; factor names inside an "
        "operand (`out * (self.scale_depth / n)`)",
        ("tests/triage/test_change_classes.py", "tests/triage/test_normaliser.py"),
    ),
    Rule(
        "in-place update in a loop",
        "scale",
        "python.inplace_in_loop",
        "an in-place update (`*=`, `//=`, ...) of what a `for` loop's items reach, added inside the loop: applied "
        "once per iteration, compounding on a shared object; a local counter or `self.calls += 1` is not",
        ("tests/triage/test_inplace_in_loop.py",),
    ),
    Rule(
        "early return removed",
        "scale",
        "python.early_return_removed",
        "`if c: return v` taken out of a function that still returns `v` multiplied or divided (`return base * "
        "mscale * mscale`): the cases `c` selected now get the scaled value; the return they reach named",
        ("tests/triage/test_early_return.py",),
    ),
    Rule(
        "argument dropped",
        "guard",
        "python.argument_dropped",
        "a keyword argument deleted from a call that stays (same function, same callee, no positional argument "
        "gained, no `**mapping`): the callee now computes with its default",
        ("tests/triage/test_change_classes.py",),
    ),
    Rule(
        "default flipped",
        "guard",
        "python.default_flipped",
        'the fallback of a config read changed, object and key unchanged (`getattr(config, "k", False)` -> '
        '`True`, `cfg.get("k", x)`): every config without the key now takes the other value',
        ("tests/triage/test_default_flipped.py",),
    ),
    Rule(
        "argument shifted",
        "guard",
        "python.argument_shifted",
        "a call that stays whose arguments now bind to other parameters of the callee (read against its "
        "signature in the tree); the parameter each lands in named",
        ("tests/triage/test_shifted_argument.py",),
    ),
    Rule(
        "uninitialised memory",
        "memory",
        "python.uninitialised_memory",
        "`empty`/`empty_like`/`new_empty` where the same function used `zeros`/`zeros_like`/`full`/...",
        ("tests/triage/test_change_classes.py",),
    ),
    Rule(
        "CUDA-graph state",
        "cuda_graph",
        "python.cuda_graph_state",
        "buffers allocated or re-sliced in capture/replay code (functions or classes named `*cuda_graph*`, "
        "`capture`, `replay`, ...); a branch on `is_in_piecewise_cuda_graph()` / `is_capturing` removed; a numeric "
        "constant such a function returns changed (`1` -> `1.0` is the same value)",
        ("tests/triage/test_change_classes.py", "tests/triage/test_graph_constants.py"),
    ),
    Rule(
        "Triton kernel indexing",
        "kernel_indexing",
        "python.kernel_indexing",
        "in a `@triton.jit` function, a changed statement that defines a pointer or a value a pointer update or a "
        "`tl.load`/`tl.store` address reads, named with the update it feeds",
        ("tests/triage/test_kernel_indexing.py",),
    ),
    Rule(
        "slice moved",
        "view_moved",
        "python.slice_moved",
        "`x = x[..., :n]` removed in one function and the same subscript added in another: the calls in between "
        "receive a strided view instead of the whole tensor, or the reverse",
        ("tests/triage/test_moved_slice.py",),
    ),
    Rule(
        "selection collapsed (Python)",
        "guard",
        "python.selection_collapsed",
        "`A if c else B` -> `B`, the rest of the statement unchanged; a condition (or a local bound to one and "
        "deleted) forced to `True`/`False`; the condition and both arms named; said once when the value flow "
        "already reads it as a factor's identity change",
        ("tests/triage/test_collapse.py",),
    ),
    Rule(
        "precision lowered",
        "precision",
        "python.precision_lowered",
        "a low-precision dtype **assigned**, passed (`dtype=`), returned or `.to()`-cast; `.half()`/`.bfloat16()`; "
        "tf32 switches. Not: a dtype compared (`x.dtype == torch.bfloat16`) or given to an allocation "
        "(`torch.empty(..., dtype=torch.bfloat16)`)",
        ("tests/triage/test_change_classes.py",),
    ),
    Rule(
        "precision under a changed condition",
        "precision",
        "python.precision_under_condition",
        "a low-precision value assigned under an `if` whose condition the patch changed",
        ("tests/triage/test_change_classes.py",),
    ),
    Rule(
        "buffer replaced by its float",
        "precision",
        "python.buffer_as_float",
        'a registered buffer (`register_buffer("n", torch.tensor(x))`, which follows the module\'s dtype) replaced '
        "in a multiply by the float `x` it was made from",
        ("tests/triage/test_buffer_float.py",),
    ),
    Rule(
        "switch read",
        "gating",
        "python.switch_read",
        "the environment variable, launch flag or config key the changed lines (or the conditions they run under) "
        "read: how to A/B the patch; none found is 'ungated'",
        ("tests/triage/test_change_classes.py",),
    ),
    Rule(
        "C-family scale argument",
        "scale",
        "cfamily.scale_argument",
        "on tokens: a call argument changed between an identity literal (`1.0f`, `1.0`, `1`) and a scale-like "
        "expression (a product or quotient, `sqrtf`/`powf`/`expf`, a name such as `kq_scale`), either way; calls "
        "matched by name, occurrence and arity inside the statements the diff touches",
        ("tests/triage/test_cargs.py",),
    ),
    Rule(
        "C-family precision request",
        "precision",
        "cfamily.precision_request",
        "on tokens: a precision request (`ggml_mul_mat_set_prec(kq, GGML_PREC_F32)`, `PREC_F32`, `COMPUTE_32F`) "
        "removed, or put under block conditions it did not have (`if (arch == ...) {`)",
        ("tests/triage/test_cargs.py",),
    ),
    Rule(
        "C-family case moved",
        "guard",
        "cfamily.case_moved",
        "a `case` label moved to another group of the same `switch` (another return value or branch), both "
        "outcomes named; labels reordered within a group or added are not moves",
        ("tests/triage/test_cswitch.py",),
    ),
    Rule(
        "C-family switch no longer set",
        "guard",
        "cfamily.switch_unset",
        "a field assigned `true`/`false` removed or flipped where the same file tests it, directly or through a "
        "local initialised from it; the test named",
        ("tests/triage/test_switch_unset.py",),
    ),
    Rule(
        "selection collapsed (C-family)",
        "guard",
        "cfamily.selection_collapsed",
        "`c ? A : B` -> `B` on tokens, the rest of the statement unchanged; the condition and both arms named",
        ("tests/triage/test_collapse.py",),
    ),
    Rule(
        "factor at a call argument or in a returned value",
        "scale",
        "flow.factor_at_call",
        "an identity literal (`1.0`, `None`) replaced by the factor or the reverse, at a call argument or in a "
        "returned value (whole, or one item of a tuple); the factor newly passed to a call; followed into the callee "
        "(keyword and positional arguments, `self.attr` set in `__init__` and read in `forward`, locals bound to a "
        "class) to the multiplies it reaches; a returned value's callers are not followed, and the warning says so",
        ("tests/triage/test_flow.py", "tests/triage/test_returned_values.py"),
    ),
    Rule(
        "identity chosen by a statement",
        "scale",
        "flow.identity_by_statement",
        "a local set to an identity (`1.0`, `0`, `None`) in one arm of an `if` and to a value in the other (or a "
        "default overridden under a condition), read by a multiply: the selection collapsed into its value arm, "
        "its condition changed, or introduced where the value was always applied",
        ("tests/triage/test_stmt_identity.py",),
    ),
    Rule(
        "factor applied twice on one path",
        "double_application",
        "flow.double_on_path",
        "a change that lets the factor reach a multiply under conditions where another multiply on the same "
        "execution path already applies it, where before the two were exclusive; every site named with its "
        "condition",
        ("tests/triage/test_flow.py", "tests/triage/test_flow_trees.py"),
    ),
    Rule(
        "factor applied a different number of times",
        "count",
        "flow.applied_count",
        "a multiply of the factor removed with no other on its path (applied nowhere), re-guarded or moved into a "
        "loop (more often), or the factor passed into a callee not read here (the multiplies on the same path)",
        ("tests/triage/test_flow.py", "tests/triage/test_common_names.py"),
    ),
    Rule(
        "widened condition that decides where a factor applies",
        "count",
        "flow.widened_factor_condition",
        "a condition named after the factor (`_fuses_routed_scaling_factor_in_topk`) widened by a dropped conjunct: "
        "the kernels of the cases it now admits, found by name and said so",
        ("tests/triage/test_widen_factor.py",),
    ),
    Rule(
        "not reachable from the served model",
        "reach",
        "flow.model_reach",
        "a changed model file outside the served model's import closure (`--model`, or the manifest's model "
        "folder): one tier lower, with the reason",
        ("tests/triage/test_reach.py",),
    ),
    Rule(
        "not selectable on the served platform",
        "reach",
        "platform.placement",
        "a change under a branch the platform never takes, in a function or module only such code refers to, or in "
        "a class only another platform's dispatch returns (`--platform`): one tier lower, with the reason",
        ("tests/triage/test_platform.py",),
    ),
)

# Modules of the rule folders that read code for the rules and raise no signal of their own.
READERS: dict[str, str] = {
    "python.inert": "the proof that a Python change is inert (same math)",
    "cfamily.tokens": "the C-family token stream, and its proof that a change is inert",
    "cfamily.statements": "C-family statements and calls on the token stream",
    "cfamily.hot_loop": "how often a changed C-family function runs",
    "flow.values": "where a value goes: arguments, locals, attributes, identity selections in expressions",
    "flow.sites": "every site of a name, with its guards",
    "flow.resolve": "names resolved to their definitions across the tree",
    "flow.dispatch": "method calls resolved through the tree's own dispatch, and what it cannot read",
    "flow.units": "who calls or instantiates whom",
    "flow.hot_path": "how often a changed Python function runs",
    "platform.conditions": "platform tests read in three values",
    "platform.phases": "a condition of the running batch (decode, prefill, a speculative step) read as a phase, "
    "never as a switch",
}


def rule_modules() -> list[str]:
    """Every module of the rule folders, as ``folder.name`` (read off the package, not this list)."""
    import pkgutil

    out: list[str] = []
    for folder in RULE_FOLDERS:
        package = importlib.import_module(f"speedtrap.triage.{folder}")
        out.extend(f"{folder}.{m.name}" for m in pkgutil.iter_modules(package.__path__))
    return sorted(out)


def signal_table() -> str:
    """The Markdown table of the rules, as ``docs/triage.md`` shows it between the two markers."""
    rows = [
        TABLE_BEGIN,
        "",
        "| rule | signal | what raises it | example (from the module's docstring) | module | tests |",
        "|---|---|---|---|---|---|",
    ]
    for r in RULES:
        tests = ", ".join(f"`{t.removeprefix('tests/triage/')}`" for t in r.tests)
        module = f"`{r.module.replace('.', '/')}.py`"
        rows.append(f"| {r.name} | {r.signal} | {r.raises} | {r.example()} | {module} | {tests} |")
    rows += ["", TABLE_END]
    return "\n".join(rows)


def docstring_has_example(module: str) -> bool:
    """Whether the module's docstring (read from the source) holds a literal block (``::``)."""
    path = importlib.import_module(f"speedtrap.triage.{module}").__file__
    assert path is not None
    with open(path, encoding="utf-8") as fh:
        doc = ast.get_docstring(ast.parse(fh.read())) or ""
    return any(line.rstrip().endswith("::") for line in doc.split("\n"))


def unlisted(rules: tuple[Rule, ...] = RULES) -> list[str]:
    """Modules of the rule folders that are neither a rule of ``rules`` nor a reader: rules missing from the list."""
    listed = {r.module for r in rules} | set(READERS)
    return [m for m in rule_modules() if m not in listed]


def replace_table(text: str) -> str:
    """``text`` (the docs page) with the part between the markers replaced by ``signal_table()``."""
    begin, end = text.index(TABLE_BEGIN), text.index(TABLE_END) + len(TABLE_END)
    return text[:begin] + signal_table() + text[end:]


if __name__ == "__main__":  # regenerate the table: python -m speedtrap.triage.registry docs/triage.md
    import sys
    from pathlib import Path

    page = Path(sys.argv[1])
    page.write_text(replace_table(page.read_text()))
