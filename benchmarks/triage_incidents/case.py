"""One incident of the corpus: the public fix it reverses, the release it is rebuilt on, the edits."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Case:
    id: str
    source: str  # the public PR/issue the culprit comes from
    package: str
    version: str
    edits: dict[str, list[tuple[str, str]]]  # file -> (old, new) edits that make the culprit
    what: str
    factor: str | None = None  # a factor case: the warning must name these sites
    sites: tuple[tuple[str, str], ...] = ()  # (file, code on the line) the warning must name
    base: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # edits that make the base tree
    held_out: str = ""  # the set it came in ("ninth set"): written before triage ran on it, first measured there


V33, V10, S410, S51, S523, LCP = (
    ("vllm", "0.33.0"),
    ("vllm", "0.10.1.1"),
    ("sglang", "0.4.10"),
    ("sglang", "0.5.1"),
    ("sglang", "0.5.23"),
    ("llama_cpp_python", "0.3.16"),
)
# Files more than one vLLM case edits.
FMOE = "vllm/model_executor/layers/fused_moe/layer.py"
DSV2 = "vllm/model_executor/models/deepseek_v2.py"
FMOE_10 = FMOE  # the same path in 0.10.1.1
