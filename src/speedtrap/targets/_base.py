"""What every in-process target gives the rest of speedtrap."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

from speedtrap.patching import Patch, PatchInfo, Undo, apply_patches, select_patches

if TYPE_CHECKING:  # torch is imported where a model runs, so the CLI starts fast
    from torch import Tensor, nn


class CausalLM(Protocol):
    """The model interface the probes and localizer drive: logits, growing a KV cache in place."""

    def __call__(self, input_ids: Tensor, cache: Any = None) -> Tensor: ...

    def new_cache(self) -> Any: ...


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

    def chat_ids(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of a chat conversation rendered with the model's own chat template."""
        ids = self.tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(t) for t in ids]

    def logits(self, ids: Sequence[int], cache: Any = None) -> Tensor:
        """Logits [tokens, vocab] of one sequence (cache, if given, grows in place)."""
        import torch

        with torch.inference_mode():
            out: Tensor = self.model(torch.tensor([list(ids)], dtype=torch.long), cache)
        return out[0]

    def new_cache(self) -> Any:
        return cast(CausalLM, self.model).new_cache()


class Target(Protocol):
    name: str
    description: str

    def patch_infos(self) -> list[PatchInfo]: ...

    def load(self, overrides: dict[str, str] | None = None) -> InProcessModel: ...
