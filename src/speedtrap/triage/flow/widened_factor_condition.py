"""A widened condition that decides where a factor is applied, linked by name to the kernels of the
cases it now admits.

A predicate such as ``_fuses_routed_scaling_factor_in_topk`` (its function or its assignment names the
factor) decides that top-k applies the factor. When a patch drops a conjunct from it (``and not
runner_backend.is_marlin()``), the cases that conjunct excluded (here: the Marlin runner) now fuse the
factor too, and the code of those cases may still apply it itself, often by handing it to a kernel
that is not read here (``moe_sum_reduce(..., routed_scaling_factor)``).

The call graph rarely links the two (runners are chosen by a registry at run time), so this check links
them by name, and says so: the words of the dropped atoms (``is_marlin`` -> ``marlin``) are matched
against the paths of the files that apply the factor, by a multiply or by passing it to a call that
resolves to no definition in the tree.

Catches::

    ... and not runner_backend.is_marlin()   ->   (dropped from _fuses_routed_scaling_factor_in_topk)

"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable

from speedtrap.triage.evidence import Signal
from speedtrap.triage.flow.resolve import Resolver
from speedtrap.triage.flow.sites import MULTIPLY, PASS, CountWarning, Site
from speedtrap.triage.source import SourceIndex

_PREFIX = re.compile(r"^(?:is|use|has|supports?|can|should|enable|allow)_")
_GENERIC = {"none", "self", "true", "false", "backend", "runner", "method", "quant", "layer", "type", "kind", "mode"}


def _words_of(name: str) -> list[str]:
    return [w for w in _PREFIX.sub("", name).lower().split("_") if len(w) >= 4 and w not in _GENERIC]


def words(names: list[str]) -> list[str]:
    """The distinctive words the dropped atoms' names share (``is_marlin``, ``is_lora_marlin`` -> ``marlin``),
    or, when they share none, all of their words."""
    each = [_words_of(n) for n in names if _words_of(n)]
    if not each:
        return []
    common = [w for w in each[0] if all(w in other for other in each[1:])]
    return common or list(dict.fromkeys(w for ws in each for w in ws))


def _handed_to_kernel(post: SourceIndex, resolver: Resolver, site: Site, factor: str) -> bool:
    """Whether the site passes the factor to a call that resolves to no definition in the tree."""
    mod = post.module(site.file)
    if mod is None:
        return False
    for node in mod.nodes_on_lines({site.line}):
        parent = mod.parent(node)
        if isinstance(parent, ast.keyword):
            parent = mod.parent(parent)
        named = (isinstance(node, ast.Name) and node.id == factor) or (
            isinstance(node, ast.Attribute) and node.attr == factor
        )
        if named and isinstance(parent, ast.Call) and not resolver.callees(mod, parent):
            return True
    return False


def widened_factor_warnings(
    guards: list[Signal],
    factor: str | None,
    post: SourceIndex,
    resolver: Resolver,
    sites_of: Callable[[str], list[Site]],
    changed: set[str],
) -> list[CountWarning]:
    """For each widened condition whose function or target names ``factor``: the sites applying it in
    files named after the cases the dropped conjuncts excluded."""
    if not factor:
        return []
    out: list[CountWarning] = []
    for s in guards:
        where = s.data.get("function", "")
        dropped = s.data.get("dropped", [])
        if not s.data.get("widened") or factor not in where or not dropped:
            continue
        keys = words(dropped)
        found = [
            site
            for site in sites_of(factor)
            if site.method == "ast"
            and site.file not in changed
            and any(k in site.file.lower() for k in keys)
            and (site.role == MULTIPLY or (site.role == PASS and _handed_to_kernel(post, resolver, site, factor)))
        ]
        if not found:
            continue
        head = next((e for e in s.evidence if e.side == "+"), s.evidence[0] if s.evidence else None)
        at = f" ({head.file}:{head.line})" if head is not None else ""
        named = ", ".join(f"`{x.code}` at {x.where} ({x.function}, {x.detail})" for x in found[:4])
        more = f" and {len(found) - 4} more" if len(found) > 4 else ""
        out.append(
            CountWarning(
                factor,
                f"possible double application of {factor}: the widened condition in {where}{at} now also covers "
                f"the cases `{', '.join(dropped)}` excluded, and on those paths {factor} is still applied at "
                f"{named}{more} (linked by name: {', '.join(keys)} in their paths, not by the call graph); "
                f"check that {factor} is applied exactly once there",
            )
        )
    return out
