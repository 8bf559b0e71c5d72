"""The switch a diff reads: an environment variable, a launch flag or a config key on the changed
lines or the conditions guarding them (``if envs.SGLANG_USE_X:`` -> env SGLANG_USE_X).

Catches::

    if envs.SGLANG_USE_X:   ->   env SGLANG_USE_X

"""

from __future__ import annotations

import ast
import re

from speedtrap.triage.evidence import (
    Evidence,
)
from speedtrap.triage.platform import phase_of
from speedtrap.triage.source import ChangedFile, Module, condition_names, last_name

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


_FLAGLIKE = re.compile(r"^_?(use|enable|enabled|apply|disable|allow|should|do|with|is|has|force)_|_(enabled|on|flag)$")


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
            if phase_of(g.test) is not None:  # a condition of the running batch (decode, prefill): not a switch
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
