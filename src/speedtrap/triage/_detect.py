"""The detectors behind triage's signals: guards removed, precision lowered, scale logic, gating.

Each reads the changed lines of one file: Python as ASTs (the old file and the patched one), other
files (and Python that does not parse) by line patterns, labelled ``method: text``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

from speedtrap.triage._changes import ChangedFile
from speedtrap.triage._pyast import Module, condition_names, last_name, short
from speedtrap.triage._trace import _ALPHA_CALLS, _DIV_CALLS, _MUL_CALLS

GUARD, PRECISION, SCALE, HOT_PATH, PHASES, GATING = "guard", "precision", "scale", "hot_path", "phases", "gating"

_LOW_DTYPES = {
    "bfloat16",
    "float16",
    "half",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float4_e2m1fn_x2",
    "int8",
    "uint8",
    "qint8",
    "quint8",
    "int4",
}
_LOW_STRINGS = {
    "bf16",
    "bfloat16",
    "fp16",
    "float16",
    "half",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "e4m3",
    "e5m2",
    "int8",
    "int4",
    "fp4",
    "nvfp4",
    "mxfp4",
    "q8_0",
    "q4_0",
    "tf32",
}
_TF32_FLAGS = {"allow_tf32", "allow_bf16_reduced_precision_reduction", "allow_fp16_reduced_precision_reduction"}
_FACTOR = re.compile(r"scal|factor|coef|multiplier|temperature|gamma|alpha", re.I)
_ROOTS = {"sqrt", "rsqrt", "isqrt"}
_ENV_CALLS = {"getenv", "get_bool_env_var", "get_int_env_var", "get_float_env_var", "get_str_env_var", "env_flag"}
_FLAG_ROOTS = {
    "server_args",
    "args",
    "global_server_args",
    "global_server_args_dict",
    "get_global_server_args",
    "get_flags",
    "cli_args",
    "launch_args",
    "engine_args",
}
_DTYPE_WORDS = {
    "bfloat16": "bf16",
    ".bfloat16()": "bf16",
    "float16": "fp16",
    "half": "fp16",
    ".half()": "fp16",
    "float8_e4m3fn": "fp8 (e4m3)",
    "float8_e4m3fnuz": "fp8 (e4m3)",
    "float8_e5m2": "fp8 (e5m2)",
    "float8_e5m2fnuz": "fp8 (e5m2)",
    "fp8_e4m3": "fp8 (e4m3)",
    "fp8_e5m2": "fp8 (e5m2)",
    "e4m3": "fp8 (e4m3)",
    "e5m2": "fp8 (e5m2)",
    "float4_e2m1fn_x2": "fp4",
    "nvfp4": "fp4",
    "mxfp4": "fp4",
}
_FLAGLIKE = re.compile(r"^_?(use|enable|enabled|apply|disable|allow|should|do|with|is|has|force)_|_(enabled|on|flag)$")
_TXT_PRECISION = re.compile(
    r"(?<!\w)(bfloat16|bf16|float16|fp16|fp8|float8_\w+|e4m3|e5m2|tf32|allow_tf32|__nv_bfloat16|__half)(?!\w)"
    r"|\.half\(\)|\.bfloat16\(\)"
)
_TXT_GUARD = re.compile(r"^\s*(assert\b|raise\s+NotImplementedError|static_assert|TORCH_CHECK|throw\b)")
_TXT_SCALE = re.compile(r"[*/]=?\s*[\w.>-]*(scal|factor)\w*", re.I)


@dataclass(frozen=True)
class Evidence:
    file: str
    line: int
    side: str  # "+" added, "-" removed, " " unchanged context
    text: str

    def render(self) -> str:
        return f"{self.file}:{self.line} {self.side} {self.text.strip()}"

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "side": self.side, "text": self.text.strip()}


@dataclass(frozen=True)
class Signal:
    kind: str
    summary: str
    evidence: tuple[Evidence, ...] = ()
    guess: bool = False
    method: str = "ast"
    data: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "summary": self.summary,
            "guess": self.guess,
            "method": self.method,
            "evidence": [e.to_json() for e in self.evidence],
            "data": self.data,
        }


def _ev(cf: ChangedFile, node_or_line: ast.AST | int, side: str) -> Evidence:
    line = node_or_line if isinstance(node_or_line, int) else getattr(node_or_line, "lineno", 0)
    text = cf.added_text(line) if side == "+" else cf.removed_text(line)
    return Evidence(cf.path, line, side, text)


def _spans(node: ast.AST, lines: frozenset[int]) -> bool:
    start = getattr(node, "lineno", None)
    if start is None:
        return False
    end = getattr(node, "end_lineno", start) or start
    return any(start <= ln <= end for ln in lines)


def guards_removed(cf: ChangedFile, old: Module, new: Module | None) -> list[Signal]:
    out: list[Signal] = []
    covered: set[int] = set()
    added_names: dict[str, set[int]] = {}
    if new is not None:
        for node in new.nodes_on_lines(cf.added):
            if isinstance(node, ast.arg):
                added_names.setdefault(node.arg, set()).add(node.lineno)
            elif isinstance(node, (ast.Name, ast.Attribute)):
                added_names.setdefault(last_name(node) or "", set()).add(node.lineno)
    for node in old.nodes:
        if not isinstance(node, ast.stmt):
            continue
        kind: str | None = None
        test: ast.AST = node
        if isinstance(node, ast.If) and node.body and all(isinstance(s, ast.Raise) for s in node.body):
            kind, test = "if ...: raise", node.test
            covered.update(id(s) for s in node.body)
        elif isinstance(node, ast.Assert):
            kind, test = "assert", node.test
        elif isinstance(node, ast.Raise) and id(node) not in covered:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if exc is None or last_name(exc) != "NotImplementedError":
                continue
            kind = "raise NotImplementedError"
        if kind is None or not (node.lineno in cf.removed or (kind == "assert" and _spans(node, cf.removed))):
            continue
        stmt_text = (
            short(node, 160) if not isinstance(node, ast.If) else f"if {short(node.test)}: {short(node.body[0], 80)}"
        )
        not_impl = "not implemented" in stmt_text.lower() or "notimplemented" in stmt_text.lower()
        names = (
            [n for n in condition_names(test) if n not in {"NotImplementedError"}] if isinstance(test, ast.expr) else []
        )
        used = [n for n in names if n in added_names]
        uses = sorted({ln for n in used for ln in added_names[n]})[:4]
        evidence = [
            _ev(cf, ln, "-") for ln in sorted(cf.removed) if node.lineno <= ln <= (node.end_lineno or node.lineno)
        ]
        evidence += [_ev(cf, ln, "+") for ln in uses]
        where = old.qualname(node).replace("<module>", "module level")
        label = "'not implemented' guard" if not_impl else f"guard ({kind})"
        if uses:
            text = (
                f"replaces the {label} `{stmt_text}` ({where}) with real logic: {', '.join(used)} now drives "
                f"new code at {', '.join(f'{cf.path}:{ln}' for ln in uses)}"
            )
        elif cf.added:
            text = f"removes the {label} `{stmt_text}` ({where}) and adds code"
        else:
            text = f"removes the {label} `{stmt_text}` ({where})"
        out.append(
            Signal(
                GUARD,
                text,
                tuple(evidence),
                data={"kind": kind, "not_implemented": not_impl, "replaced": bool(uses), "names": names},
            )
        )
    return out


def precision(cf: ChangedFile, new: Module, old: Module | None) -> list[Signal]:
    hits: dict[int, set[str]] = {}
    for node in new.nodes_on_lines(cf.added):
        found: str | None = None
        if isinstance(node, ast.Attribute) and node.attr in _LOW_DTYPES and isinstance(node.ctx, ast.Load):
            parent = new.parent(node)
            if not (isinstance(parent, ast.Call) and parent.func is node) and not _compared_or_allocated(new, node):
                found = node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"half", "bfloat16"}
            and not node.args
        ):
            found = f".{node.func.attr}()"
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.lower() in _LOW_STRINGS
            and _assigned(new, node)
        ):
            found = node.value
        elif (
            isinstance(node, ast.Assign)
            and any(last_name(t) in _TF32_FLAGS for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and node.value.value is True
        ):
            found = "tf32 enabled"
        elif (
            isinstance(node, ast.Call)
            and last_name(node.func) == "set_float32_matmul_precision"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in ("high", "medium")
        ):
            found = f"float32 matmul precision {node.args[0].value!r}"
        if found:
            hits.setdefault(getattr(node, "lineno", 0), set()).add(found)
    if not hits:
        return []
    was_fp32 = old is not None and any(
        (isinstance(n, ast.Attribute) and n.attr in {"float32", "float64", "float"})
        or (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "float")
        for n in old.nodes_on_lines(cf.removed)
    )
    kinds = sorted({_DTYPE_WORDS.get(k.lower(), k) for v in hits.values() for k in v})
    funcs = sorted({new.qualname(n) + "." + n.name for n in new.functions_touching(frozenset(hits))})
    where = f" in {', '.join(f.replace('<module>.', '') for f in funcs)}" if funcs else ""
    summary = f"precision lowered to {', '.join(kinds)}{where}" + (" (was float32)" if was_fp32 else "")
    return [Signal(PRECISION, summary, tuple(_ev(cf, ln, "+") for ln in sorted(hits)), data={"dtypes": kinds})]


def _assigned(mod: Module, node: ast.AST) -> bool:
    """Whether a value is assigned, passed or returned (not compared, not a dict key, not a message)."""
    cur, parent = node, mod.parent(node)
    while isinstance(parent, (ast.IfExp, ast.BoolOp)) and getattr(parent, "test", None) is not cur:
        cur, parent = parent, mod.parent(parent)
    if isinstance(parent, (ast.Assign, ast.AnnAssign, ast.Return, ast.NamedExpr)):
        return parent.value is cur
    if isinstance(parent, ast.keyword):
        return True
    return isinstance(parent, ast.Call) and cur in parent.args and last_name(parent.func) in {"to", "set_dtype"}


_ALLOC_CALLS = {
    "empty",
    "zeros",
    "ones",
    "full",
    "empty_like",
    "zeros_like",
    "ones_like",
    "full_like",
    "arange",
    "new_empty",
    "new_zeros",
    "new_ones",
    "new_full",
    "randn",
    "rand",
    "tensor",
}


def _compared_or_allocated(mod: Module, node: ast.AST) -> bool:
    """A dtype compared (``x.dtype == torch.bfloat16``) or given to an allocation: no value is rounded."""
    parent = mod.parent(node)
    if isinstance(parent, (ast.Tuple, ast.List, ast.Set)):
        parent = mod.parent(parent)
    if isinstance(parent, ast.Compare):
        return True
    if isinstance(parent, ast.keyword) and parent.arg == "dtype":
        call = mod.parent(parent)
        return isinstance(call, ast.Call) and last_name(call.func) in _ALLOC_CALLS
    return False


def _factor_names(operand: ast.AST, symbol: str | None) -> list[str]:
    """Factor-like names an operand reads: ``self.scale``, or inside ``(self.scale_depth / sqrt(n))``; and
    a normaliser it computes, named by its text: a root or inverse power (``hidden_size**-0.5``,
    ``d ** 0.5``, ``math.sqrt(d)``, ``torch.rsqrt(v)``)."""
    out: list[str] = []
    for n in ast.walk(operand):
        if isinstance(n, (ast.Name, ast.Attribute)):
            name = last_name(n)
            if name and (name == symbol or _FACTOR.search(name)) and name not in out:
                out.append(name)
    for n in ast.walk(operand):
        label = _normaliser(n)
        if label is not None and label not in out:
            out.append(label)
    return out


def _normaliser(node: ast.AST) -> str | None:
    """``x ** e`` with a fractional or negative constant ``e``, or a (reciprocal) square root, as text."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        e = node.right
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub) and isinstance(e.operand, ast.Constant):
            value = e.operand.value
            return short(node, 80) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        if isinstance(e, ast.Constant) and isinstance(e.value, float) and not e.value.is_integer():
            return short(node, 80)
    if isinstance(node, ast.Call) and last_name(node.func) in _ROOTS:
        return short(node, 80)
    return None


def _factor_ops(mod: Module, lines: frozenset[int], symbol: str | None) -> dict[str, list[tuple[ast.AST, str]]]:
    out: dict[str, list[tuple[ast.AST, str]]] = {}
    for node in mod.nodes_on_lines(lines):
        operands: list[ast.AST] = []
        op = ""
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div)):
            operands, op = (
                ([node.left, node.right] if isinstance(node.op, ast.Mult) else [node.right]),
                "multiply" if isinstance(node.op, ast.Mult) else "divide",
            )
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Mult, ast.Div)):
            operands, op = [node.value], "multiply" if isinstance(node.op, ast.Mult) else "divide"
        elif isinstance(node, ast.Call):
            callee = last_name(node.func) if isinstance(node.func, (ast.Name, ast.Attribute)) else None
            if callee in _MUL_CALLS:
                operands, op = list(node.args), "multiply"
            elif callee in _DIV_CALLS:
                operands, op = list(node.args[-1:]), "divide"
            elif callee in _ALPHA_CALLS:
                operands, op = [k.value for k in node.keywords if k.arg == "alpha"], "multiply"
        for operand in operands:
            for name in _factor_names(operand, symbol):
                out.setdefault(name, []).append((node, op))
    return out


def _in_loop(mod: Module, node: ast.AST) -> str | None:
    """The loop (``for layer in self.layers``) that repeats ``node`` within its function, if any."""
    for anc in mod.ancestors(node):
        if isinstance(anc, (ast.For, ast.AsyncFor)):
            return f"for {short(anc.target, 30)} in {short(anc.iter, 50)}"
        if isinstance(anc, ast.While):
            return f"while {short(anc.test, 50)}"
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return None
    return None


def scale(cf: ChangedFile, new: Module | None, old: Module | None, symbol: str | None) -> list[Signal]:
    added = _factor_ops(new, cf.added, symbol) if new else {}
    removed = _factor_ops(old, cf.removed, symbol) if old else {}
    out: list[Signal] = []
    for name in sorted(set(added) | set(removed)):
        a, r = added.get(name, []), removed.get(name, [])
        ev = [_ev(cf, n, "-") for n, _ in r] + [_ev(cf, n, "+") for n, _ in a]
        a_funcs = sorted({new.qualname(n) for n, _ in a}) if new else []
        r_funcs = sorted({old.qualname(n) for n, _ in r}) if old else []
        op = (a or r)[0][1]
        if a and not r:
            guards = (
                [" and ".join(new.describe_guard(g) for g in new.guards(n)) or "unconditionally" for n, _ in a]
                if new
                else []
            )
            text = f"adds a {op} by {name} in {', '.join(a_funcs)} ({'; '.join(sorted(set(guards)))})"
            change = "added"
        elif r and not a:
            text = f"removes a {op} by {name} from {', '.join(r_funcs)}"
            change = "removed"
        elif a_funcs != r_funcs:
            text = f"moves a {op} by {name} from {', '.join(r_funcs)} to {', '.join(a_funcs)}"
            change = "moved"
        else:
            assert new is not None and old is not None
            before = {" and ".join(old.describe_guard(g) for g in old.guards(n)) or "unconditional" for n, _ in r}
            after = {" and ".join(new.describe_guard(g) for g in new.guards(n)) or "unconditional" for n, _ in a}
            loops_before = {_in_loop(old, n) for n, _ in r}
            loops_after = {_in_loop(new, n) for n, _ in a}
            if before == after and loops_before != loops_after:
                was = " / ".join(sorted(x or "once" for x in loops_before))
                now = " / ".join(sorted(f"once per iteration of `{x}`" if x else "once" for x in loops_after))
                text = f"changes how many times the {op} by {name} in {', '.join(a_funcs)} runs: was {was}, now {now}"
                change = "repeat changed"
            elif before == after:
                text, change = f"rewrites a {op} by {name} in {', '.join(a_funcs)}", "rewritten"
            else:
                text = (
                    f"changes when the {op} by {name} in {', '.join(a_funcs)} applies: was "
                    f"{' / '.join(sorted(before))}, now {' / '.join(sorted(after))}"
                )
                change = "guard changed"
        out.append(Signal(SCALE, text, tuple(ev), data={"factor": name, "change": change}))
    return out


def gating(cf: ChangedFile, new: Module) -> tuple[str, str, list[Evidence]] | None:
    env: list[tuple[str, int]] = []
    flag: list[tuple[str, int]] = []
    config: list[tuple[str, int]] = []
    nodes = list(new.nodes_on_lines(cf.added))
    stmts = new.statements_touching(cf.added)
    for stmt in stmts:
        for g in new.guards(stmt):
            # A switch selects the changed code only when the code runs with it on: conditions it runs
            # without (else branches, early exits such as validation raises) do not gate it.
            if not g.holds or g.how == "early exit":
                continue
            nodes.extend(ast.walk(g.test))
            names = [n for n in condition_names(g.test) if _FLAGLIKE.search(n)]
            if names or (g.line in cf.added and "config" in ast.unparse(g.test)):
                config.append(((names or condition_names(g.test) or [""])[0], g.line))
    for node in nodes:
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Call):
            callee = last_name(node.func) if isinstance(node.func, (ast.Name, ast.Attribute)) else None
            arg0 = node.args[0] if node.args else None
            key = arg0.value if isinstance(arg0, ast.Constant) and isinstance(arg0.value, str) else ""
            if callee in _ENV_CALLS or (
                callee == "get" and isinstance(node.func, ast.Attribute) and last_name(node.func.value) == "environ"
            ):
                env.append((key, line))
            elif callee == "add_argument" and key.startswith("--"):
                flag.append((key, line))
        elif isinstance(node, ast.Subscript) and last_name(node.value) == "environ":
            key_node = node.slice
            env.append(
                (key_node.value if isinstance(key_node, ast.Constant) and isinstance(key_node.value, str) else "", line)
            )
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "envs":
                env.append((node.attr, line))
            elif node.value.id in _FLAG_ROOTS:
                flag.append((node.attr, line))
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Call)
            and last_name(node.value.func) in _FLAG_ROOTS
        ):
            flag.append((node.attr, line))
    for kind, found in (("env", env), ("flag", flag), ("config", config)):
        if found:
            key = next((k for k, _ in found if k), "")
            lines = sorted({ln for _, ln in found})
            return kind, key, [Evidence(cf.path, ln, "+" if ln in cf.added else " ", cf.added_text(ln)) for ln in lines]
    return None


def text_signals(cf: ChangedFile) -> list[Signal]:
    out: list[Signal] = []
    added = [(ln.new_no or 0, ln.text) for ln in cf.patch.added()]
    removed = [(ln.old_no or 0, ln.text) for ln in cf.patch.removed()]
    checks = (
        (PRECISION, "precision lowered (text match)", _TXT_PRECISION, added, "+"),
        (GUARD, "guard removed (text match)", _TXT_GUARD, removed, "-"),
        (SCALE, "scale logic changed (text match)", _TXT_SCALE, added + removed, "±"),
    )
    for kind, label, pattern, lines, side in checks:
        hits = [Evidence(cf.path, no, side, text) for no, text in lines if pattern.search(text)]
        if hits:
            out.append(Signal(kind, f"{label} in {cf.path}", tuple(hits[:8]), method="text"))
    return out
