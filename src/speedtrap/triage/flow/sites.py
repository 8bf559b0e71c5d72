"""Every site that reads, multiplies, divides, passes on or configures a name, with its guards.

Python files are read with ``ast``; other text files get a line search clearly labelled ``text``.
A patch that adds a multiply by the factor while another multiply on the same execution path stays
under conditions that do not exclude it is reported as a possible double application.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from speedtrap.triage.flow.units import Units
from speedtrap.triage.source import Module, SourceIndex
from speedtrap.triage.wording import HEADLINE, evidence_line, split_reason

MULTIPLY, DIVIDE, CONFIGURE, PASS, READ = "multiply", "divide", "configure", "pass", "read"
_PRIORITY = {MULTIPLY: 0, DIVIDE: 1, CONFIGURE: 2, PASS: 3, READ: 4}
MUL_CALLS = {"mul", "mul_", "multiply", "scale_", "addcmul", "addcmul_"}
DIV_CALLS = {"div", "div_", "divide", "true_divide"}
ALPHA_CALLS = {"add", "add_", "sub", "sub_", "addmm", "addmm_", "baddbmm", "lerp"}
TRANSPARENT = {"float", "int", "abs", "Tensor", "tensor"}


@dataclass(frozen=True)
class Site:
    file: str
    line: int
    function: str
    unit: str | None
    role: str
    detail: str
    code: str
    guards: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    literals: tuple[tuple[str, bool], ...] = ()
    method: str = "ast"  # "ast", or "text" (a line search: no roles beyond a guess, no guards)
    patch: str | None = None  # the patch whose added lines hold this site

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "function": self.function,
            "role": self.role,
            "detail": self.detail,
            "code": self.code,
            "guards": list(self.guards),
            "flags": list(self.flags),
            "method": self.method,
            "patch": self.patch,
        }


@dataclass(frozen=True)
class DoubleApplication:
    """Two sites that may both apply one factor on one execution path: ``added`` (the patch's, or the one the
    factor newly reaches) and ``other``; ``also`` the further sites applying it on that path. ``message`` is one
    line; ``lines`` the evidence: every site with its condition, how the two meet, the flow, what was before."""

    symbol: str
    patch: str
    added: Site
    other: Site
    relation: str
    verb: str = "adds"  # "adds" a multiply, or "lets the factor reach" one (a path change)
    path: str = ""  # how the two are on one path ("DeepseekV2MoE calls HashTopK")
    flow: tuple[str, ...] = ()  # where the factor starts, then the calls that carry it to ``added``
    when: str = ""  # the conditions under which both now run
    before: str = ""  # what the code selected there before the patch
    also: tuple[Site, ...] = ()  # other sites applying the factor on the same path
    unresolved: tuple[str, ...] = ()  # calls on the way not resolved: each with its candidates

    @property
    def message(self) -> str:
        """One line: the two sites, by place when that fits, else by function."""
        more = f" (+{len(self.also)} more on the path)" if self.also else ""
        head = f"possible double application of {self.symbol}: {self.patch} {self.verb}"
        text = f"{head} {self.added.where} while {self.other.where} still applies it{more}"
        if len(text) > HEADLINE:
            text = f"{head} {self.added.function} while {self.other.function} still applies it{more}"
        return text

    @property
    def lines(self) -> tuple[str, ...]:
        out = [_site_line(self.added, "new" if self.verb == "adds" else "now reached"), _site_line(self.other, "")]
        out += [_site_line(s, "") for s in self.also]
        if self.path:
            out.append(f"path: {self.path.removeprefix('same path: ')}")
        if self.flow:
            out.append(f"flow: {' -> '.join(self.flow)}")
        if self.when:
            out.append(f"both run when {self.when}")
        if self.before:
            out.append(f"before the patch: {self.before}")
        out += [f"not resolved: {u}" for u in self.unresolved]
        return tuple(evidence_line(line) for line in out)

    @property
    def in_full(self) -> str:
        """The message with its evidence lines, one per line."""
        return "\n".join((self.message, *self.lines))

    def to_json(self) -> dict[str, Any]:
        return {
            "symbol": self.symbol,
            "patch": self.patch,
            "added": self.added.to_json(),
            "other": self.other.to_json(),
            "also": [s.to_json() for s in self.also],
            "path": self.path,
            "flow": list(self.flow),
            "when": self.when,
            "before": self.before,
            "unresolved": list(self.unresolved),
            "relation": self.relation,
            "message": self.message,
            "lines": list(self.lines),
        }


def _site_line(site: Site, mark: str) -> str:
    when = " and ".join(site.guards) or "always"
    tag = f" ({mark})" if mark else ""
    return f"site{tag}: {site.where} {site.function}: `{site.code}` when {when}"


@dataclass(frozen=True)
class CountWarning:
    """A factor that may now be applied a different number of times (not at all, more often, or twice
    through a callee not read here), in words that name the sites."""

    factor: str
    message: str

    @property
    def headline(self) -> str:
        return split_reason(self.message)[0]

    @property
    def lines(self) -> tuple[str, ...]:
        return split_reason(self.message)[1]

    def to_json(self) -> dict[str, Any]:
        return {"factor": self.factor, "message": self.message, "headline": self.headline, "lines": list(self.lines)}


@dataclass
class TraceResult:
    symbol: str
    sites: list[Site] = field(default_factory=list)
    added: list[Site] = field(default_factory=list)
    double_applications: list[DoubleApplication] = field(default_factory=list)
    files_scanned: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "symbol": self.symbol,
            "files_scanned": self.files_scanned,
            "sites": [s.to_json() for s in self.sites],
            "added_by_patches": [s.to_json() for s in self.added],
            "double_applications": [d.to_json() for d in self.double_applications],
        }


def _role(mod: Module, node: ast.AST) -> tuple[str, str]:
    if isinstance(node, ast.arg):
        return CONFIGURE, "parameter"
    if isinstance(node, ast.keyword):
        if isinstance(node.value, ast.Constant):
            return CONFIGURE, f"sets {node.arg}={ast.unparse(node.value)}"
        return PASS, f"passed on as {node.arg}="
    if isinstance(node, ast.Constant):
        parent = mod.parent(node)
        if isinstance(parent, ast.Dict) and any(k is node for k in parent.keys):
            return CONFIGURE, "config key"
        return READ, "read by name (string)"
    if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Store):
        parent = mod.parent(node)
        if isinstance(parent, ast.AugAssign):
            return CONFIGURE, "updated in place"
        return CONFIGURE, "assigned"
    cur: ast.AST = node
    parent = mod.parent(node)
    while isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id in TRANSPARENT:
        cur, parent = parent, mod.parent(parent)
    if isinstance(parent, ast.BinOp):
        if isinstance(parent.op, ast.Mult):
            return MULTIPLY, "operand of *"
        if isinstance(parent.op, (ast.Div, ast.FloorDiv)):
            return (DIVIDE, "divisor") if parent.right is cur else (READ, "dividend")
    if isinstance(parent, ast.AugAssign) and parent.value is cur:
        if isinstance(parent.op, ast.Mult):
            return MULTIPLY, "*="
        if isinstance(parent.op, (ast.Div, ast.FloorDiv)):
            return DIVIDE, "/="
    if isinstance(parent, ast.keyword):
        call = mod.parent(parent)
        callee = _callee_name(call)
        if parent.arg == "alpha" and callee in ALPHA_CALLS:
            return MULTIPLY, f"scaled {callee}(alpha=)"
        return PASS, f"passed to {callee or 'a call'}({parent.arg}=)"
    if isinstance(parent, ast.Call) and any(a is cur for a in parent.args):
        callee = _callee_name(parent)
        if callee in MUL_CALLS:
            return MULTIPLY, f"{callee}()"
        if callee in DIV_CALLS:
            return DIVIDE, f"{callee}()"
        return PASS, f"passed to {callee or 'a call'}()"
    return READ, "read"


def _callee_name(call: ast.AST | None) -> str | None:
    if isinstance(call, ast.Call):
        if isinstance(call.func, ast.Attribute):
            return call.func.attr
        if isinstance(call.func, ast.Name):
            return call.func.id
    return None


def _occurrences(mod: Module, symbol: str) -> Iterable[ast.AST]:
    for node in mod.nodes:
        if isinstance(node, ast.Name):
            hit = node.id == symbol
        elif isinstance(node, ast.Attribute):
            hit = node.attr == symbol
        elif isinstance(node, (ast.arg, ast.keyword)):
            hit = node.arg == symbol
        else:
            hit = isinstance(node, ast.Constant) and node.value == symbol
        if hit:
            yield node


def python_sites(mod: Module, symbol: str, lines: frozenset[int] | None = None, patch: str | None = None) -> list[Site]:
    """The sites of ``symbol`` in a module, one per line (the strongest role on that line)."""
    best: dict[int, tuple[int, ast.AST, str, str]] = {}
    for node in _occurrences(mod, symbol):
        line = getattr(node, "lineno", 0)
        if lines is not None and line not in lines:
            continue
        role, detail = _role(mod, node)
        if line not in best or _PRIORITY[role] < best[line][0]:
            best[line] = (_PRIORITY[role], node, role, detail)
    return [
        make_site(mod, node, role, detail, symbol, patch) for _line, (_p, node, role, detail) in sorted(best.items())
    ]


def make_site(mod: Module, node: ast.AST, role: str, detail: str, symbol: str, patch: str | None = None) -> Site:
    """The site of ``node``: where, in which function, under which guards."""
    line = getattr(node, "lineno", 0)
    guards = mod.guards(node)
    unit, _func = mod.scope_of(node)
    flags: list[str] = []
    for g in guards:
        flags.extend(f for f in g.flags() if f not in flags and f != symbol)
    return Site(
        mod.path,
        line,
        mod.qualname(node),
        unit,
        role,
        detail,
        mod.line(line),
        tuple(mod.describe_guard(g) for g in guards),
        tuple(flags),
        tuple(lit for g in guards for lit in g.literals()),
        "ast",
        patch,
    )


def text_sites(path: str, text: str, symbol: str, note: str = "text") -> list[Site]:
    """A labelled line search for files that are not (valid) Python."""
    word = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(symbol)}(?![A-Za-z0-9_])")
    mul = re.compile(rf"\*=?\s*(?:[\w.>-]+(?:\.|->))?{re.escape(symbol)}\b|\b{re.escape(symbol)}\s*\*(?![*=])")
    div = re.compile(rf"/=?\s*(?:[\w.>-]+(?:\.|->))?{re.escape(symbol)}\b")
    conf = re.compile(rf"\b{re.escape(symbol)}\b\"?\s*[:=](?!=)")
    out = []
    for no, line in enumerate(text.split("\n"), 1):
        if not word.search(line):
            continue
        role = (
            MULTIPLY if mul.search(line) else DIVIDE if div.search(line) else CONFIGURE if conf.search(line) else READ
        )
        out.append(Site(path, no, "?", None, role, f"{role} (guessed from the line)", line.strip()[:200], method=note))
    return out


def trace_tree(index: SourceIndex, symbol: str) -> tuple[list[Site], int]:
    """Every site of ``symbol`` in the tree, Python by AST and other text files by line search."""
    sites: list[Site] = []
    py = index.containing([symbol])
    for rel in py:
        mod = index.module(rel)
        if mod is None:
            sites.extend(text_sites(rel, index.read(rel) or "", symbol, "text (not valid Python 3)"))
        else:
            sites.extend(python_sites(mod, symbol))
    for rel in index.containing([symbol], python=False):
        sites.extend(text_sites(rel, index.read(rel) or "", symbol))
    return sites, len(index.python_files) + len(index.other_files)


def _equivalent(a: str, b: str, aliases: Mapping[str, set[str]]) -> bool:
    if a == b or b in aliases.get(a, set()):
        return True
    return any(b in aliases.get(mid, set()) for mid in aliases.get(a, set()))


def aliases_of(mods: Iterable[Module]) -> dict[str, set[str]]:
    """Flag names tied by ``self.a = b`` or ``f(a=self.b)``: the same switch under two names."""
    out: dict[str, set[str]] = {}

    def tie(a: str | None, b: str | None) -> None:
        if a and b and a != b:
            out.setdefault(a, set()).add(b)
            out.setdefault(b, set()).add(a)

    for mod in mods:
        for node in mod.nodes:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.value, (ast.Name, ast.Attribute))
            ):
                target = node.targets[0]
                if isinstance(target, (ast.Name, ast.Attribute)):
                    tie(_tail(target), _tail(node.value))
            elif isinstance(node, ast.keyword) and node.arg and isinstance(node.value, (ast.Name, ast.Attribute)):
                tie(node.arg, _tail(node.value))
    return out


def _tail(node: ast.AST) -> str | None:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None


def clash(
    a: Iterable[tuple[str, bool]], b: Iterable[tuple[str, bool]], aliases: Mapping[str, set[str]]
) -> list[tuple[str, bool]]:
    """The literals of ``b`` that some literal of ``a`` contradicts (one needs a flag on, the other off)."""
    a = list(a)
    return [(fb, pb) for fb, pb in b if any(pa != pb and _equivalent(fa, fb, aliases) for fa, pa in a)]


def _excludes(a: Site, b: Site, aliases: Mapping[str, set[str]]) -> bool:
    """Whether the two sites' guards cannot both hold (one needs a flag on, the other off)."""
    return bool(clash(a.literals, b.literals, aliases))


def _net_new(applications: list[Site], index: SourceIndex, post: SourceIndex, symbol: str) -> list[Site]:
    """The added multiplies that are not rewrites of a multiply the file already had (same function, same
    guards): a reordered or reformatted expression applies the factor as often as before."""
    out: list[Site] = []
    for rel in sorted({s.file for s in applications}):
        old, new = index.module(rel), post.module(rel)
        before: dict[tuple[str, tuple[str, ...]], int] = {}
        for s in python_sites(old, symbol) if old is not None else []:
            if s.role == MULTIPLY:
                before[(s.function, s.guards)] = before.get((s.function, s.guards), 0) + 1
        after: dict[tuple[str, tuple[str, ...]], int] = {}
        for s in python_sites(new, symbol) if new is not None else []:
            if s.role == MULTIPLY:
                after[(s.function, s.guards)] = after.get((s.function, s.guards), 0) + 1
        for s in applications:
            if s.file == rel and after.get((s.function, s.guards), 0) > before.get((s.function, s.guards), 0):
                out.append(s)
    return out


def double_applications(
    index: SourceIndex,
    symbol: str,
    patch: str,
    post: SourceIndex,
    added_lines: Mapping[str, frozenset[int]],
    units: Units | None = None,
    base_sites: list[Site] | None = None,
) -> tuple[list[Site], list[DoubleApplication]]:
    """Sites a patch adds, and the multiplies on the same path that could apply the factor again."""
    added: list[Site] = []
    for rel, lines in added_lines.items():
        mod = post.module(rel)
        if mod is not None and lines:
            added.extend(python_sites(mod, symbol, lines, patch))
    applications = _net_new([s for s in added if s.role == MULTIPLY], index, post, symbol)
    if not applications:
        return added, []
    if base_sites is None:
        base_sites, _ = trace_tree(index, symbol)
    others: list[Site] = [
        s for s in base_sites if s.file not in added_lines and s.role == MULTIPLY and s.method == "ast"
    ]
    for rel, lines in added_lines.items():
        mod = post.module(rel)
        if mod is not None:
            others.extend(s for s in python_sites(mod, symbol) if s.line not in lines and s.role == MULTIPLY)
    units = units or Units(post)
    related: list[tuple[Site, Site, str, int]] = []
    for a in applications:
        for b in others:
            relation = units.relation(a.file, a.unit, b.file, b.unit)
            if relation is not None:
                related.append((a, b, *relation))
    files = {s.file for a, b, _, _ in related for s in (a, b)}
    aliases = aliases_of(m for m in (post.module(f) for f in sorted(files)) if m is not None)
    found: list[tuple[int, int, DoubleApplication]] = []
    for a, b, text, hops in related:
        same = post.module(a.file) if a.file == b.file and b.file in added_lines else None
        if same is not None and same.exclusive_lines(a.line, b.line):
            continue  # opposite arms of one choice: alternatives, not two applications
        if not _excludes(a, b, aliases):
            found.append((hops, len(found), DoubleApplication(symbol, patch, a, b, f"same path: {text}", path=text)))
    return added, [d for _, _, d in sorted(found, key=lambda t: (t[0], t[1]))]
