"""How often a changed C-family function runs, read on tokens: on every layer when it is called from
inside a loop over the layers (``for (int il = 0; il < n_layer; ++il)``), directly or through up to
three callers, in the C-family files of the tree that name it.

The changed statement's function is the outermost block header around it that is a definition
(``ggml_tensor * llm_graph_context::build_ffn(...) {``); a statement that is itself inside a layer loop
runs on every layer without a caller.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from speedtrap.triage.cfamily.statements import NOT_CALLS, Token, statements, with_headers
from speedtrap.triage.cfamily.tokens import C_FAMILY, tokens_at
from speedtrap.triage.flow import EVERY_LAYER, HotPath

_LAYER_COUNTS = {"n_layer", "n_layers", "num_layers", "num_hidden_layers", "n_layer_all"}
_NOT_DEFS = {"if", "for", "while", "switch", "else", "do", "struct", "class", "namespace", "enum", "union", "extern"}
_MAX_DEPTH = 3


def _header_tokens(header: str) -> list[str]:
    found = tokens_at(header)
    return [t for t, _ in found] if found else []


def _is_layer_loop(header: str) -> bool:
    toks = _header_tokens(header)
    return bool(toks) and toks[0] == "for" and any(t in _LAYER_COUNTS or t.endswith(".n_layer") for t in toks)


def definition(header: str) -> str | None:
    """The function a block header defines (``llm_graph_context::build_ffn(...) {`` -> ``build_ffn``)."""
    toks = _header_tokens(header)
    if not toks or toks[0] in _NOT_DEFS | {"return"} or "(" not in toks or "=" in toks[: toks.index("(")]:
        return None
    name = toks[toks.index("(") - 1]
    return name if name.isidentifier() and name not in NOT_CALLS else None


def _calls_in(stmt: list[Token]) -> set[str]:
    return {stmt[i][0] for i in range(len(stmt) - 1) if stmt[i + 1][0] == "(" and stmt[i][0].isidentifier()}


@lru_cache(maxsize=64)
def _callers(path: str, mtime: float, name: str) -> tuple[tuple[str, bool], ...]:
    """(caller function, called inside a layer loop) for each call of ``name`` in one file."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ()
    toks = tokens_at(text)
    if toks is None:
        return ()
    out: list[tuple[str, bool]] = []
    for stmt, headers in with_headers(statements(toks)):
        defines = stmt[-1][0] == "{" and definition(" ".join(t for t, _ in stmt)) == name
        if name not in _calls_in(stmt) or defines:
            continue
        caller = next((d for d in (definition(h) for h in headers) if d), "")
        out.append((caller, any(_is_layer_loop(h) for h in headers)))
    return tuple(out)


def _files_naming(root: Path, near: Path, name: str) -> list[Path]:
    out: list[Path] = []
    for path in sorted(near.rglob("*")):
        if path.suffix in C_FAMILY and path.is_file():
            try:
                if f"{name}(" in path.read_text(errors="replace"):
                    out.append(path)
            except OSError:
                continue
    return out


def c_hot_path(root: Path, rel: str, text: str, lines: frozenset[int]) -> HotPath | None:
    """Every layer, with the chain of calls that shows it, or None when no layer loop is found."""
    toks = tokens_at(text)
    if toks is None:
        return None
    touched = [(s, h) for s, h in with_headers(statements(toks)) if any(s[0][1] <= ln <= s[-1][1] for ln in lines)]
    if not touched:
        return None
    _stmt, headers = touched[0]
    func = next((d for d in (definition(h) for h in headers) if d), None)
    if any(_is_layer_loop(h) for h in headers):
        return HotPath(f"{rel}:{func or '?'}", EVERY_LAYER, (func or rel, "inside a loop over the layers"), ())
    if func is None:
        return None
    near = (root / rel).parent
    todo: list[tuple[str, tuple[str, ...]]] = [(func, (func,))]
    seen = {func}
    while todo:
        name, path = todo.pop(0)
        if len(path) > _MAX_DEPTH:
            continue
        for file in _files_naming(root, near, name):
            for caller, in_loop in _callers(str(file), file.stat().st_mtime, name):
                if in_loop:
                    chain = [*path, f"{caller or file.name} (layer loop in {file.relative_to(root)})"]
                    return HotPath(f"{rel}:{func}", EVERY_LAYER, tuple(chain), ())
                if caller and caller not in seen:
                    seen.add(caller)
                    todo.append((caller, (*path, caller)))
    return None
