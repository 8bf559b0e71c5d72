"""A constructed bug for ``speedtrap serve``: a prompt cache that serves a repeated prompt from stale KV.

Ground truth for the determinism probe (``speedtrap probe repeat``). Switched on at launch with
``SPEEDTRAP_SERVE_STALE_PROMPT_CACHE=1`` or ``--stale-prompt-cache``, like a speed flag of a real
server. The first request for a prompt is computed correctly, and the KV cache it leaves is kept.
An identical request later hits that entry and takes the "cached" path: the prompt is run again
on top of the kept KV cache, as if that cache were a prefix it extends, instead of on an empty one.
Every position then attends to the prompt twice at shifted positions: the answer is wrong, but
only from the second identical request on (the failure mode of SGLang #13469 and vLLM #43559).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from speedtrap.probe import Engine

if TYPE_CHECKING:
    from torch import Tensor

ENV = "SPEEDTRAP_SERVE_STALE_PROMPT_CACHE"


class StalePromptCache:
    """Prompt logits through a cache whose hits are computed on stale KV (see the module docstring)."""

    def __init__(self, engine: Engine, entries: int = 8) -> None:
        self.engine = engine
        self.entries = entries
        self._kv: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        self.hits = 0

    def prompt_logits(self, ids: Sequence[int]) -> Tensor:
        key = tuple(int(t) for t in ids)
        kept = self._kv.get(key)
        if kept is not None:
            self.hits += 1
            self._kv.move_to_end(key)
            return self.engine.logits_on(key, kept.copy())  # the bug: runs on the prompt's own KV
        cache = self.engine.model.new_cache()
        logits = self.engine.logits_on(key, cache)
        self._kv[key] = cache
        while len(self._kv) > self.entries:
            self._kv.popitem(last=False)
        return logits


def stale_cache_on(environ: Any) -> bool:
    return str(environ.get(ENV, "")).strip().lower() in {"1", "true", "yes", "on"}
