"""What every in-process target gives the rest of speedtrap."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, cast

from speedtrap._errors import ProbeError, UsageError
from speedtrap.patching import Patch, PatchInfo, Undo, apply_patches, select_patches

if TYPE_CHECKING:  # torch is imported where a model runs, so the CLI starts fast
    from torch import Tensor, nn


from speedtrap.targets._lockstep import BATCH_CACHE_ROWS, LockstepStats  # why 8: see there


class CausalLM(Protocol):
    """The model interface the probes and localizer drive: logits, growing a KV cache in place."""

    def __call__(self, input_ids: Tensor, cache: Any = None) -> Tensor: ...

    def new_cache(self) -> Any: ...


class BatchDecoder(Protocol):
    """A model that decodes several sequences a step: ``batch_cache(caches, rows)`` is the cache that
    ``model(input_ids [rows, 1], cache)`` takes, each sequence attending to its own cache alone."""

    def batch_cache(self, caches: list[Any], rows: int) -> Any: ...


@dataclass
class InProcessModel:
    """A loaded model with its tokenizer and patch catalogue; patches swap in and out around it."""

    name: str
    model: nn.Module
    tokenizer: Any
    catalog: Sequence[Patch]
    config: dict[str, Any]
    active: tuple[str, ...] = ()
    _undo: Undo = field(default_factory=Undo)
    # per set of active patches: whether its forwards keep no state (lockstep decoding is then exact)
    _stateless: dict[tuple[str, ...], bool] = field(default_factory=dict)
    lockstep_stats: LockstepStats = field(default_factory=LockstepStats)  # GEMMs lockstep ran, calls served

    def set_patches(self, names: Iterable[str]) -> None:
        """Undo the patches now applied, then apply ``names`` (in catalogue order)."""
        chosen = select_patches(self.catalog, names)
        self._undo()
        self.active = ()
        self._undo = apply_patches(self.model, chosen)
        self.active = tuple(p.info.name for p in chosen)

    @contextmanager
    def patched(self, names: Iterable[str]) -> Iterator[InProcessModel]:
        before = self.active
        self.set_patches(names)
        try:
            yield self
        finally:
            self.set_patches(before)

    def patch_infos(self) -> list[PatchInfo]:
        return [p.info for p in self.catalog]

    def add_patches(self, patches: Sequence[Patch]) -> None:
        """Add patches (a user's) to the catalogue; one already there by name is kept as it is."""
        known = {p.info.name for p in self.catalog}
        self.catalog = [*self.catalog, *(p for p in patches if p.info.name not in known)]

    def chat_ids(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of a chat conversation rendered with the model's own chat template."""
        if self.tokenizer is None:
            raise ProbeError(
                f"{self.name} has no tokenizer: chats (planted-fact recall, serving) "
                "need a tokenizer and a chat template",
                "use a target with one (a model directory with tokenizer files, a GGUF file, smol-moe); "
                "divergence and layer diffs run without one, on synthetic token ids",
            )
        ids = self.tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(t) for t in ids]

    def synthetic_ids(self, text: str, tokens: int) -> list[int]:
        """``tokens`` token ids drawn from the vocabulary with a seed taken from ``text``: the stand-in
        for a tokenized text on a model without a tokenizer (a tiny random-weight config)."""
        import random

        vocab = int(self.config.get("vocab_size", 0))
        if vocab < 2:
            raise UsageError(f"{self.name} has neither a tokenizer nor a vocab_size", "use a target with a tokenizer")
        rng = random.Random(hashlib.sha256(text.encode()).digest())
        return [rng.randrange(vocab) for _ in range(max(1, tokens))]

    def logits(self, ids: Sequence[int], cache: Any = None) -> Tensor:
        """Logits [tokens, vocab] of one sequence (cache, if given, grows in place)."""
        import torch

        with torch.inference_mode():
            out: Tensor = self.model(torch.tensor([list(ids)], dtype=torch.long), cache)
        return out[0]

    def new_cache(self) -> Any:
        return cast(CausalLM, self.model).new_cache()

    @property
    def batches(self) -> bool:
        """Whether decode steps run several sequences in one step: the model's own batched decode
        (:class:`BatchDecoder`), or lockstep (:mod:`speedtrap.targets._lockstep`: every other model)
        unless the model says it cannot (``lockstep_safe()`` False) or its first decode step changed
        module state (checked once per set of active patches; until then this says True)."""
        if callable(getattr(self.model, "batch_cache", None)):
            return True
        declared = getattr(self.model, "lockstep_safe", None)
        if callable(declared) and not declared():
            return False
        return self._stateless.get(self.active, True)

    def decode_step(self, tokens: Sequence[int], caches: Sequence[Any]) -> Tensor:
        """Logits [len(tokens), vocab]: token i fed on top of ``caches[i]`` (each grows by one), in one
        forward whose GEMMs read the weights once for all (:data:`BATCH_CACHE_ROWS` rows at a time).

        A model without ``batch_cache`` runs lockstep: a forward per sequence, its weight GEMMs shared
        (the same bits alone or together); one that :attr:`batches` rules out runs its sequences one
        after another, each still through lockstep (so its answers are the same bits either way)."""
        import torch

        if len(tokens) != len(caches) or not tokens:
            raise ValueError("decode_step needs one cache per token, and at least one")
        if callable(getattr(self.model, "batch_cache", None)):
            rows = -(-len(tokens) // BATCH_CACHE_ROWS) * BATCH_CACHE_ROWS
            fed = [int(t) for t in tokens] + [int(tokens[0])] * (rows - len(tokens))
            cache = cast(BatchDecoder, self.model).batch_cache(list(caches), rows)
            with torch.inference_mode():
                out: Tensor = self.model(torch.tensor(fed, dtype=torch.long).unsqueeze(-1), cache)
            return out[: len(tokens), -1]
        from speedtrap.targets._lockstep import lockstep

        calls = [partial(self._one_token, int(t), c) for t, c in zip(tokens, caches, strict=True)]
        if self.active not in self._stateless:
            return torch.stack([self._checked(call) for call in calls])
        if not self.batches:
            return torch.stack([lockstep([call], stats=self.lockstep_stats)[0] for call in calls])
        return torch.stack(lockstep(calls, stats=self.lockstep_stats))

    def _one_token(self, token: int, cache: Any) -> Tensor:
        import torch

        out: Tensor = self.model(torch.tensor([[token]], dtype=torch.long), cache)
        return out[0, -1]

    def _checked(self, call: Callable[[], Tensor]) -> Tensor:
        """``call`` alone through lockstep, recording whether it changed module state."""
        from speedtrap.targets._lockstep import lockstep, module_state

        before = module_state(self.model)
        row = lockstep([call], stats=self.lockstep_stats)[0]
        same = module_state(self.model) == before
        self._stateless[self.active] = self._stateless.get(self.active, True) and same
        return row


class Target(Protocol):
    """What gets run in-process: smol-moe, ``hf:<model type | dir | gguf>``; every stage loads it the same way."""

    name: str
    description: str

    @property
    def chats(self) -> bool:
        """Whether it has a tokenizer and a chat template (planted-fact recall and serving need them)."""
        ...

    def patch_infos(self) -> list[PatchInfo]:
        """The target's own patch catalogue (what a search covers by default)."""
        ...

    def load(self, overrides: Mapping[str, str] | None = None, extra_patches: Sequence[Patch] = ()) -> InProcessModel:
        """Build the model with config ``overrides``; ``extra_patches`` (a user's) join its catalogue."""
        ...
