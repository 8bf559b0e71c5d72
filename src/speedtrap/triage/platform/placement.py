"""Which changed code the served platform can select (``--platform cuda``), read off the code.

A changed line is *not selectable* on a platform when it lies in a branch the platform never takes:

- under ``if TEST:`` whose test is false on the platform, or in the ``elif``/``else`` of a test that is
  always true on it. Tests are read (``_platcond``) on the AST in three values (true, false, not decided) with Kleene's
  ``and``/``or``/``not``: vLLM's ``current_platform.is_rocm()`` (``is_cuda``, ``is_cpu``, ``is_xpu``,
  ``is_tpu``, ``is_cuda_alike``, ...), SGLang's imported ``is_hip()`` / ``is_cuda()`` / ``is_cpu()`` /
  ``is_npu()`` / ..., ``torch.version.hip``, and module-level names bound once to such a test in the same
  file (``_is_hip = is_hip()``, ``_use_aiter = get_bool_env_var(...) and _is_hip``). Anything else (an
  environment variable, a device capability) is not decided, so ``if _is_cuda or _is_hip`` runs on both.
- in a platform class that the release's own dispatch selects only for another platform (vLLM's
  ``rocm_platform_plugin`` returns ``"vllm.platforms.rocm.RocmPlatform"``), when nothing in the tree
  subclasses it.
- in a file every reference to which (imports, dotted strings) is itself not selectable: a module imported
  only under ``if current_platform.is_rocm():``. One reference the reading cannot place (a bare mention
  of the module's name in a string, an import in code that runs) keeps the file.

Nothing is read from a bare name: a file called ``rocm_*.py`` is not demoted for its name. When unsure,
the change is kept (and said to be "not decided" where nothing could be read).

Catches::

    if _is_hip: x = x * 2   ->   x * 3   (not selectable on platform cuda)

"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property

from speedtrap.spec import Platform
from speedtrap.triage.flow import Resolver
from speedtrap.triage.platform.conditions import (
    CPU,
    CUDA,
    ROCM,
    TPU,
    XPU,
    Conditions,
    local_names,
    stmt_blocks,
    t_and,
    t_not,
    t_or,
)
from speedtrap.triage.source import ChangedFile, Module, SourceIndex

# -- where a line sits --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """Why a line cannot run on the platform, in words ("under `if _is_hip:` (FILE:LINE)")."""

    words: str
    key: tuple[str, int]  # the file and line of the test (or class) that blocks it


def _span(stmts: list[ast.stmt]) -> tuple[int, int]:
    return stmts[0].lineno, max(getattr(s, "end_lineno", s.lineno) or s.lineno for s in stmts)


def _within(stmts: list[ast.stmt], line: int) -> bool:
    if not stmts:
        return False
    lo, hi = _span(stmts)
    return lo <= line <= hi


def _header(node: ast.If, mod: Module) -> str:
    test = ast.unparse(node.test)
    word = "elif" if mod.line(node.lineno).startswith("elif") else "if"
    return f"`{word} {test if len(test) <= 60 else test[:57] + '...'}:`"


def _why(cond: Conditions, test: ast.expr, rel: str) -> str:
    """The alias a test reads, as bound (``: _use_aiter = ... (FILE:LINE)``)."""
    names = [n.id for n in ast.walk(test) if isinstance(n, ast.Name) and n.id in cond.aliases]
    if not names:
        return ""
    value, line = cond.aliases[names[0]]
    text = ast.unparse(value)
    return f": {names[0]} = {text if len(text) <= 70 else text[:67] + '...'} ({rel}:{line})"


def line_block(cond: Conditions, rel: str, line: int, platform: Platform, classes: dict[str, str]) -> Block | None:
    """Why ``line`` of the file cannot run on ``platform``, or None (it may, or it is not decided).

    ``classes``: top-level class names of this file that the release's dispatch selects only for other
    platforms, with the words saying so."""
    mod = cond.mod
    body: list[ast.stmt] = mod.tree.body
    local: frozenset[str] = frozenset()
    depth = 0
    while body and depth < 64:
        depth += 1
        node = next((s for s in body if s.lineno <= line <= (s.end_lineno or s.lineno)), None)
        if node is None:
            return None
        if depth == 1 and isinstance(node, ast.ClassDef) and node.name in classes:
            return Block(f"in class {node.name}, {classes[node.name]} ({rel}:{node.lineno})", (rel, node.lineno))
        if isinstance(node, ast.If):
            # The body is not selectable when the test is false on the platform; the elif/else when it is true.
            arms = ((node.body, False), (node.orelse, True))
            arm = next(((b, blocked_when) for b, blocked_when in arms if _within(b, line)), None)
            if arm is None:
                return None  # the test itself: evaluated wherever the block runs
            body, blocked_when = arm
            if cond.truth(node.test, platform, local) is blocked_when and cond.reads_platform(node.test, local):
                head = f"{_header(node, mod)} ({rel}:{node.lineno})"
                where = (
                    f"after {head}, which is always taken on platform {platform}"
                    if blocked_when
                    else f"under {head}, false on {platform}"
                )
                return Block(f"{where}{_why(cond, node.test, rel)}", (rel, node.lineno))
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            local = local | local_names(node)
        inner = [
            b
            for b in stmt_blocks(node)
            if b and b[0].lineno <= line <= (_span(b)[1])  # the block holding the line, if any
        ]
        if not inner:
            return None
        body = inner[0]
    return None


# -- the release's own platform dispatch (vLLM) -------------------------------------------------------

_DISPATCH_NAMES = {"cuda": CUDA, "rocm": ROCM, "cpu": CPU, "xpu": XPU, "tpu": TPU}


@dataclass(frozen=True)
class Dispatch:
    """``<name>_platform_plugin`` functions returning ``"pkg.mod.ClassName"``: which platform selects which
    class (``rocm_platform_plugin`` -> ``vllm.platforms.rocm.RocmPlatform``)."""

    file: str
    selects: dict[str, list[tuple[str, int, Platform | None]]]  # dotted class -> [(plugin, line, platform)]

    def others(self, platform: Platform) -> dict[str, tuple[str, int, Platform | None]]:
        """Classes only other platforms' plugins select, with the first plugin naming each (none when
        ``platform`` has no plugin here)."""
        mine = {c for c, named in self.selects.items() if any(p is platform for _, _, p in named)}
        if not mine:
            return {}
        return {c: named[0] for c, named in self.selects.items() if c not in mine}


def find_dispatch(index: SourceIndex) -> Dispatch | None:
    for rel in index.python_files:
        if not rel.endswith("platforms/__init__.py") or "_platform_plugin" not in (index.read(rel) or ""):
            continue
        mod = index.module(rel)
        if mod is None:
            continue
        selects: dict[str, list[tuple[str, int, Platform | None]]] = {}
        for fn in mod.tree.body:
            if not (isinstance(fn, ast.FunctionDef) and fn.name.endswith("_platform_plugin")):
                continue
            name = fn.name[: -len("_platform_plugin")]
            for n in ast.walk(fn):
                if isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"[\w.]+\.\w+", n.value):
                    selects.setdefault(n.value, []).append((fn.name, n.lineno, _DISPATCH_NAMES.get(name)))
        if selects:
            return Dispatch(rel, selects)
    return None


# -- a patch's verdict --------------------------------------------------------------------------------

_MAX_FILES = 60  # a name or module referenced from more files than this is shared code: not read further
# References are followed through this many functions, and files, that cannot run themselves (each step
# is a search of the tree's text: kept short so a whole-tree triage takes about as long as without it).
_NAME_DEPTH = 2
_FILE_DEPTH = 1


@dataclass
class PlatformReach:
    """One tree and platform: the verdict on each patch's changed files (``verdict``)."""

    index: SourceIndex
    platform: Platform
    _dispatch: list[Dispatch | None] = field(default_factory=list)

    def dispatch(self) -> Dispatch | None:
        if not self._dispatch:
            self._dispatch.append(find_dispatch(self.index))
        return self._dispatch[0]

    def verdict(self, files: list[ChangedFile], post: SourceIndex | None = None) -> tuple[bool | None, str]:
        """(False: no changed line can run on the platform; True: one may; None: not decided), in words.
        ``post``: the tree with the patch laid on (references are read there)."""
        return _Reader(post or self.index, self.platform, self.dispatch(), self.index).verdict(files)


@dataclass
class _Reader:
    index: SourceIndex
    platform: Platform
    dispatch: Dispatch | None
    base: SourceIndex  # the tree without the patch: its parsed files are shared across patches
    _files: dict[str, Block | None] = field(default_factory=dict)
    _names: dict[str, Block | None] = field(default_factory=dict)
    _conds: dict[str, Conditions] = field(default_factory=dict)
    _classes: dict[str, dict[str, str]] = field(default_factory=dict)

    @cached_property
    def resolver(self) -> Resolver:
        return Resolver(self.index)

    def conditions(self, mod: Module) -> Conditions:
        key = f"{id(mod)}:{mod.path}"
        if key not in self._conds:
            self._conds[key] = Conditions(mod)
        return self._conds[key]

    def verdict(self, files: list[ChangedFile]) -> tuple[bool | None, str]:
        p = self.platform
        blocks: list[Block] = []
        for f in files:
            if not f.is_python:
                return None, f"platform {p} not decided: {f.path} is not Python"
            found = self.file_blocks(f)
            if found is None:
                return True, (
                    f"selectable on platform {p} as far as read: a change in {f.path} is under no platform "
                    f"test false on {p}"
                )
            blocks.extend(found)
        if not blocks:
            return None, f"platform {p} not decided: no changed line to place"
        keys = list(dict.fromkeys(b.key for b in blocks))
        more = f" (and {len(keys) - 1} more such place{'s' if len(keys) > 2 else ''})" if len(keys) > 1 else ""
        return False, f"not selectable on platform {p}: {blocks[0].words}{more}"

    def file_blocks(self, f: ChangedFile) -> list[Block] | None:
        """The block of every changed line of ``f`` (old lines in the old text, new in the new), or None
        when one of them may run on the platform."""
        out: list[Block] = []
        for side, lines in (("new", f.added), ("old", f.removed)):
            if not lines:
                continue
            mod = self._parsed(f, side)
            if mod is None:
                return None
            for line in sorted(lines):
                b = self.place(mod, f.path, line, 0)
                if b is None:
                    whole = self.file_block(f.path, 0)
                    return [whole] if whole is not None else None
                out.append(b)
        return out or None

    def _parsed(self, f: ChangedFile, side: str) -> Module | None:
        """``f``'s new (or old) text parsed, taken from the index that holds it when it does (parsed once)."""
        text, index = (f.new_text, self.index) if side == "new" else (f.old_text, self.base)
        if text is not None and index.read(f.path) == text:
            return index.module(f.path)
        return f.new_module() if side == "new" else f.old_module()

    def place(self, mod: Module, rel: str, line: int, depth: int) -> Block | None:
        """Why ``line`` of ``mod`` cannot run: its branch, or a function around it that only code which
        cannot run refers to."""
        cond = self.conditions(mod)
        b = line_block(cond, rel, line, self.platform, self.foreign_classes(rel))
        if b is not None or depth >= _NAME_DEPTH:
            return b
        for fn in _defs_around(mod.tree.body, line):
            b = self.name_block(fn.name, rel, depth + 1)
            if b is not None:
                return Block(f"in {fn.name}, {b.words}", b.key)
        return None

    def foreign_classes(self, rel: str) -> dict[str, str]:
        """Top-level classes of ``rel`` that only other platforms' dispatch selects, with the words."""
        if rel in self._classes:
            return self._classes[rel]
        out: dict[str, str] = {}
        d = self.dispatch
        module = rel[: -len(".py")].replace("/", ".")
        for dotted, (plugin, line, other) in (d.others(self.platform) if d is not None else {}).items():
            mod_name, _, cls = dotted.rpartition(".")
            if not (module == mod_name or module.endswith("." + mod_name)) or self._subclassed(cls):
                continue
            whom = f"for {other}" if other is not None else f"by {plugin}"
            out[cls] = f"which the release's platform dispatch selects only {whom} ({d.file}:{line} {plugin})"  # type: ignore[union-attr]
        self._classes[rel] = out
        return out

    def _subclassed(self, cls: str) -> bool:
        """Whether a class in the tree derives from ``cls`` (read off the text: ``class X(..., cls...)``)."""
        derives = re.compile(rf"^[ \t]*class\s+\w+\s*\([^)]*\b{re.escape(cls)}\b", re.M)
        return any(derives.search(self.index.read(rel) or "") for rel in self.index.containing([cls]))

    # -- references: a file (module) or a function name --------------------------------------------

    def file_block(self, rel: str, depth: int) -> Block | None:
        """Why no code of file ``rel`` can run on the platform (every reference to it cannot), or None."""
        key = f"{rel}@{depth}"  # a deeper reading stops sooner: its answer is not the shallower one's
        if key not in self._files:
            self._files[key] = None  # a cycle reads as "may run"
            self._files[key] = self._file_block(rel, depth)
        return self._files[key]

    def _file_block(self, rel: str, depth: int) -> Block | None:
        if depth > _FILE_DEPTH or not rel.endswith(".py") or rel.endswith("__init__.py"):
            return None
        module = rel[: -len(".py")].replace("/", ".")
        leaf = module.rsplit(".", 1)[-1]
        candidates = set(self.index.containing([leaf]))
        candidates.discard(rel)
        word = re.escape(leaf)
        # First the cheap answer: an import at the top of a file that may itself run (read off the text,
        # no parse; another module of the same name only makes this keep more).
        top = re.compile(rf"^(from|import)\b[^\n(]*(\([^)]*)?\b{word}\b", re.M)
        for other in sorted(candidates):
            if (
                not _is_test(other)
                and top.search(self.index.read(other) or "")
                and not self.file_block(other, depth + 1)
            ):
                return None
        looks = re.compile(  # an import line naming it, or a string that is a dotted name holding it
            rf"^[ \t]*(from|import)\b[^\n(]*(\([^)]*)?\b{word}\b|['\"][\w.:]*\b{word}\b[\w.:]*['\"]", re.M
        )
        return self._blocked_refs(
            sorted(candidates),
            leaf,
            lambda other: self._module_refs(other, rel, module, leaf),
            f"{rel} is only imported where platform {self.platform} cannot go",
            depth,
            looks,
        )

    def name_block(self, name: str, home: str, depth: int) -> Block | None:
        """Why function ``name`` (defined in ``home``) never runs: every reference to it, outside its own
        definition, cannot; or None."""
        if name.startswith("__") or len(name) < 6:
            return None
        key = f"{home}:{name}@{depth}"
        if key not in self._names:
            self._names[key] = None
            self._names[key] = self._blocked_refs(
                self.index.containing([name]),
                name,
                lambda other: _name_refs(self.index.read(other) or "", name),
                f"which is only referred to where platform {self.platform} cannot go",
                depth,
            )
        return self._names[key]

    def _blocked_refs(
        self,
        candidates: Iterable[str],
        word: str,
        read: Callable[[str], list[int] | None],
        words: str,
        depth: int,
        looks: re.Pattern[str] | None = None,
    ) -> Block | None:
        """Why every reference ``read`` finds (in the files holding ``word``, outside tests) cannot run, or
        None: one may, one cannot be placed, there are none, or too many files hold it. Lazy: the first
        reference that may run ends the reading. ``looks``: a pattern a file's text must match to hold one.
        A file is parsed only when it holds a reference."""
        candidates = [c for c in candidates if not _is_test(c)]
        if len(candidates) > 4 * _MAX_FILES:
            return None
        pattern = re.compile(rf"\b{re.escape(word)}\b")
        holding = [c for c in candidates if pattern.search(self.index.read(c) or "")]
        if len(holding) > _MAX_FILES:
            return None
        first: Block | None = None
        seen: list[tuple[str, int]] = []
        for other in holding:
            if looks is not None and not looks.search(self.index.read(other) or ""):
                continue
            lines = read(other)
            if lines is None:
                return None
            mod = self.index.module(other) if lines else None
            if lines and mod is None:
                return None
            for line in lines:
                assert mod is not None
                b = self._dispatch_ref(other, mod, line) or self.place(mod, other, line, depth + 1)
                b = b or self.file_block(other, depth + 1)
                if b is None:
                    return None
                first = first or b
                seen.append((other, line))
        if first is None:
            return None
        where = ", ".join(f"{o}:{n}" for o, n in seen[:2]) + (", ..." if len(seen) > 2 else "")
        return Block(f"{words} ({where}: {first.words})", first.key)

    def _dispatch_ref(self, other: str, mod: Module, line: int) -> Block | None:
        """A dotted string in another platform's ``<name>_platform_plugin``: selected only there (when the
        served platform has a plugin of its own in the tree)."""
        d = self.dispatch
        if d is None or other != d.file or not d.others(self.platform):
            return None
        for fn in mod.tree.body:
            if isinstance(fn, ast.FunctionDef) and fn.lineno <= line <= (fn.end_lineno or fn.lineno):
                plat = _DISPATCH_NAMES.get(fn.name.removesuffix("_platform_plugin"))
                if fn.name.endswith("_platform_plugin") and plat is not None and plat is not self.platform:
                    return Block(f"named by {fn.name} ({other}:{fn.lineno})", (other, fn.lineno))
        return None

    def _module_refs(self, other: str, rel: str, module: str, leaf: str) -> list[int] | None:
        """Lines of ``other`` that import ``rel`` or name it in a dotted string; None when ``leaf`` appears in
        a string the reading cannot place (a registry of bare module names)."""
        mod = self.index.module(other)
        if mod is None:
            return None
        out: list[int] = []
        resolver = self.resolver
        for n in ast.walk(mod.tree):
            if isinstance(n, ast.ImportFrom):
                base = resolver._relative(other, n.level, n.module) if n.level else resolver.module_file(n.module or "")
                for a in n.names:
                    dotted = f"{n.module}.{a.name}" if n.module else a.name
                    sub = resolver._relative(other, n.level, dotted) if n.level else resolver.module_file(dotted)
                    if sub == rel or (base == rel and sub is None):
                        out.append(n.lineno)
            elif isinstance(n, ast.Import):
                for a in n.names:
                    if resolver.module_file(a.name) == rel or a.name.startswith(module + "."):
                        out.append(n.lineno)
            elif isinstance(n, ast.Constant) and isinstance(n.value, str) and leaf in n.value:
                if n.value == module or n.value.startswith((module + ".", module + ":")):
                    out.append(n.lineno)
                elif re.fullmatch(rf"[\w.:]*\b{re.escape(leaf)}\b[\w.:]*", n.value):
                    return None  # a module name the reading cannot place
            elif isinstance(n, ast.JoinedStr) and leaf in ast.unparse(n):
                return None
        return out


def _is_test(rel: str) -> bool:
    """A test file: the served stack does not run it, so a reference from it does not count."""
    parts = rel.split("/")
    return any(p in ("test", "tests") for p in parts[:-1]) or parts[-1].startswith("test_")


def _name_refs(text: str, name: str) -> list[int] | None:
    """Lines of ``text`` that use ``name`` (a call, an attribute, an import), read off the text: a line that
    defines it (``def name(``) or is a comment does not count; None when it appears quoted (looked up by
    name: ``getattr(self, "forward_hip")``) or as a keyword (``name=``), which the reading cannot place."""
    out: list[int] = []
    word = re.compile(rf"\b{re.escape(name)}\b")
    quoted = re.compile(rf"[\"'][\w.:]*\b{re.escape(name)}\b[\w.:]*[\"']|\b{re.escape(name)}\s*=(?!=)")
    defines = re.compile(rf"^\s*(async\s+)?def\s+{re.escape(name)}\s*\(")
    for no, line in enumerate(text.split("\n"), 1):
        if not word.search(line) or line.lstrip().startswith("#") or defines.match(line):
            continue
        if quoted.search(line):
            return None
        out.append(no)
    return out


def _defs_around(body: list[ast.stmt], line: int) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The functions holding ``line``, innermost first."""
    out: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
    stack = list(body)
    while stack:
        node = stack.pop()
        if not (node.lineno <= line <= (node.end_lineno or node.lineno)):
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append(node)
        inner = [node.body, node.orelse] if isinstance(node, ast.If) else stmt_blocks(node)
        stack.extend(s for b in inner for s in b)
    return out[::-1]


__all__ = ["Conditions", "PlatformReach", "line_block", "t_and", "t_not", "t_or"]
