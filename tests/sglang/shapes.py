"""What a real SGLang 0.5.23 server answered, and the rule ``serve --dialect sglang`` is held to.

``tests/data/sglang-shapes/*.json`` are requests and the real server's responses, recorded from SGLang 0.5.23
serving ``speedtrap export --format hf`` (``MODEL_DIR`` stands for the model folder). :func:`differences`
compares an answer of the imitation with the real one: every field the imitation writes must be one the real
server writes, with the same JSON type (a list of the same length); token ids and texts must be equal and
logprobs within ``LOGPROB_TOL`` (both serve the same function in float32). Fields that differ per run (ids,
timestamps) and the imitation's own name (``owned_by``) are skipped. Fields only the real server writes are
returned apart: the imitation need not write what speedtrap's client does not read, but the list shows it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

SHAPES = Path(__file__).resolve().parents[1] / "data" / "sglang-shapes"
LOGPROB_TOL = 1e-3  # float32 on both sides, the same weights: measured differences are below 3e-5
VOLATILE = {"id", "created", "seconds", "weight_version", "weight_versions", "e2e_latency", "model",
            "response_sent_to_client_ts", "queue_time", "prefill_launch_delay", "prefill_launch_latency",
            "prefill_finished_ts", "inference_time", "decode_throughput", "forward_entry_time"}  # fmt: skip
# Where the imitation names itself on purpose (a user must be able to tell it from the real server).
IDENTITY = {"owned_by"}
# The recorded requests the tests replay (generate_128 takes 90 s on the real server: only its record is used).
REPLAYED = ("chat_completions", "chat_completions_logprobs", "completions_logprobs", "generate_decode_logprobs",
            "generate_greedy20", "generate_prompt_logprobs", "generate_text_logprobs", "tokenize_messages",
            "tokenize_prompt", "v1_models")  # fmt: skip


def load(name: str) -> dict[str, Any]:
    data = json.loads((SHAPES / f"{name}.json").read_text())
    assert isinstance(data, dict)
    return data


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def differences(real: Any, imitation: Any, path: str = "$") -> tuple[list[str], list[str]]:
    """(problems, fields only the real server writes) of ``imitation`` against ``real``."""
    problems: list[str] = []
    missing: list[str] = []
    if _kind(real) != _kind(imitation):
        return [f"{path}: real {_kind(real)} {real!r:.60}, imitation {_kind(imitation)} {imitation!r:.60}"], []
    if isinstance(real, dict):
        for key, value in imitation.items():
            if key in VOLATILE or key in IDENTITY:
                continue
            if key not in real:
                problems.append(f"{path}.{key}: written by the imitation, not by the real server")
                continue
            p, m = differences(real[key], value, f"{path}.{key}")
            problems += p
            missing += m
        missing += [f"{path}.{k}" for k in real if k not in imitation and k not in VOLATILE]
    elif isinstance(real, list):
        if len(real) != len(imitation):
            return [f"{path}: real has {len(real)} items, imitation {len(imitation)}"], []
        for i, (a, b) in enumerate(zip(real, imitation, strict=True)):
            p, m = differences(a, b, f"{path}[{i}]")
            problems += p
            missing += m
    elif isinstance(real, float) or isinstance(imitation, float):
        if not math.isclose(float(real), float(imitation), abs_tol=LOGPROB_TOL):
            problems.append(f"{path}: real {real}, imitation {imitation}")
    elif real != imitation and not (isinstance(real, str) and "MODEL_DIR" in real):
        problems.append(f"{path}: real {real!r:.80}, imitation {imitation!r:.80}")
    return problems, missing
