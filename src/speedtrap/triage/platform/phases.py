"""A batch's runtime condition is a phase, not a switch: ``if forward_mode.is_decode():`` is not a config key.

Engines branch on the state of the batch being run: its forward mode (SGLang's ``forward_batch.forward_mode
.is_decode()`` / ``is_extend()`` / ``is_target_verify()`` / ``is_draft_extend()`` / ``is_idle()``), the split of
prefills and decodes in it (vLLM's ``attn_metadata.num_decodes``, ``num_prefills``), a chunk of a prompt, a
speculative step (``spec_info``, ``spec_decode_metadata``). No config key, flag or environment variable sets
them: a user can only choose which batches to look at (a probe's prefill and decode figures, a PD stack's role)
or switch off the feature that makes the phase exist (chunked prefill, speculative decoding).

A condition is a phase when it calls an ``is_<phase>`` method of a runtime object, or reads an attribute of one
whose name says a phase; a runtime object is a name or attribute in :data:`RUNTIME` (a batch, its forward mode,
its attention metadata, its speculative info). The phase words and the runtime names were written from SGLang's
``forward_mode.is_decode()``; the test ``tests/triage/test_phases.py`` checks them on code they were not written
from (other phases, vLLM's spellings, switches that must stay switches) and lists what it misses: a phase
read off a number of the batch (``max_query_len == 1``), or a batch's state kept on ``self``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

# Objects that hold the state of the batch being run (never a setting).
RUNTIME = frozenset(
    {
        "forward_mode", "forward_batch", "batch", "attn_metadata", "attention_metadata", "common_attn_metadata",
        "spec_info", "spec_decode_metadata", "scheduler_output", "input_batch", "model_input",
        "forward_meta", "forward_context", "batch_descriptor",
    }
)  # fmt: skip
_PHASE = re.compile(r"(decode|prefill|extend|verify|draft|spec|chunk|idle|mixed)", re.I)
# The phase a word names, in the words a plan uses: the first phase word in it (``is_decode_or_idle``: decode).
_NAMES = {
    "verify": "speculative", "draft": "speculative", "spec": "speculative", "chunk": "chunked prefill",
    "mixed": "mixed prefill and decode", "idle": "idle", "decode": "decode", "prefill": "prefill", "extend": "prefill",
}  # fmt: skip
# What a user can actually switch or choose for each phase.
ADVICE = {
    "decode": "look at the decode figures (`speedtrap probe divergence` reports prefill and decode apart; on a "
    "prefill/decode stack, the decode role)",
    "prefill": "look at the prefill figures (`speedtrap probe divergence` reports prefill and decode apart; on a "
    "prefill/decode stack, the prefill role)",
    "mixed prefill and decode": "compare a run whose batches mix prefill and decode with one that does not (one "
    "request at a time)",
    "idle": "it runs on batches with no token (a data-parallel rank with nothing to do); compare with one rank",
    "chunked prefill": "relaunch with chunked prefill off (SGLang `--chunked-prefill-size -1`, vLLM "
    "`--no-enable-chunked-prefill`), or with prompts shorter than a chunk",
    "speculative": "relaunch without speculative decoding (no `--speculative-algorithm` / `--speculative-config`)",
}


@dataclass(frozen=True)
class RuntimePhase:
    """A condition of the batch a changed line runs under: the phase it selects and its text."""

    phase: str
    condition: str
    line: int
    negated: bool = False  # it runs on the batches that are not in ``phase``

    def words(self) -> str:
        which = f"batches that are not {self.phase}" if self.negated else f"{self.phase} batches"
        return (
            f"it runs only on {which} (`{self.condition}` is a condition of the batch being run, not a "
            f"setting: no config key or flag turns it off); to A/B it, {ADVICE[self.phase]}"
        )


def _chain(node: ast.expr) -> list[str]:
    """The names of an attribute chain, outermost last: ``forward_batch.forward_mode.is_decode`` -> 3 names."""
    names: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            names.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Name):
            names.append(node.id)
            return names[::-1]
        else:
            return names[::-1]


def _named(word: str) -> str | None:
    match = _PHASE.search(word)
    return None if match is None else _NAMES[match.group(1).lower()]


def phase_of(test: ast.expr) -> str | None:
    """The phase ``test`` selects when it reads the running batch's state, else None (it may be a switch)."""
    found = _phase_node(test)
    return None if found is None else found[0]


def _phase_node(test: ast.expr) -> tuple[str, ast.AST] | None:
    for node in ast.walk(test):
        if isinstance(node, ast.Name) and node.id.lstrip("_") in RUNTIME and _PHASE.search(node.id):
            return _named(node.id) or "", node  # the runtime object itself: ``spec_decode_metadata is not None``
        if not isinstance(node, ast.Attribute):
            continue
        receiver = _chain(node.value)
        if not any(name.lstrip("_") in RUNTIME for name in receiver):
            continue
        if _PHASE.search(node.attr):
            return _named(node.attr) or "", node
        if node.attr.lstrip("_") == "forward_mode":  # ``forward_batch.forward_mode == ForwardMode.DECODE``
            for other in ast.walk(test):
                if isinstance(other, ast.Attribute) and other is not node and _PHASE.search(other.attr):
                    return _named(other.attr) or "", node
    return None


def _negated(test: ast.expr, target: ast.AST) -> bool:
    """``target`` sits under an odd number of ``not`` in ``test`` (the batches it selects are the others)."""

    def walk(node: ast.AST, nots: int) -> bool | None:
        if node is target:
            return nots % 2 == 1
        step = 1 if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) else 0
        for child in ast.iter_child_nodes(node):
            found = walk(child, nots + step)
            if found is not None:
                return found
        return None

    return bool(walk(test, 0))


def runtime_phase(test: ast.expr, line: int) -> RuntimePhase | None:
    found = _phase_node(test)
    if found is None:
        return None
    return RuntimePhase(found[0], ast.unparse(test), line, _negated(test, found[1]))
