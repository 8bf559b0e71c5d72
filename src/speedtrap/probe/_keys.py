"""One key per token across engines: token ids (``token_id:N``), whatever each engine names tokens by.

vLLM with ``return_tokens_as_token_ids``, SGLang's ``/generate``, ``speedtrap serve`` and the in-process
backend name tokens by id; SGLang's ``/v1/completions`` (which drops that flag) and llama.cpp name them by
their text. Text names are mapped to ids with the target's tokenizer (``piece_ids``: the server's
``/tokenize``, or the in-process tokenizer). A name that is not exactly one token stays as text, and is
counted: it matches nothing on the other side and is reported, never dropped silently.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from speedtrap._errors import ProbeError, UsageError
from speedtrap.probe._backend import Backend, PromptLogprobs, TokenDist

ID_PREFIX = "token_id:"
Mapper = Callable[[Sequence[str]], Awaitable[dict[str, int | None]]]
TOKENIZER_CHECK = [
    {"role": "user", "content": "Name three rivers of Europe, with their lengths in kilometres."},
    {"role": "assistant", "content": "The Danube (2,850 km), the Rhine (1,230 km) and the Loire (1,006 km)."},
]


def is_id(name: str) -> bool:
    return name.startswith(ID_PREFIX)


def mapper_of(*backends: Backend) -> Mapper | None:
    """Text -> id with the first backend's tokenizer (``piece_ids``); what it cannot map, with the next's."""
    fns: list[Mapper] = [fn for fn in (getattr(b, "piece_ids", None) for b in backends) if fn is not None]
    if not fns:
        return None

    async def mapper(pieces: Sequence[str]) -> dict[str, int | None]:
        out: dict[str, int | None] = dict.fromkeys(pieces)
        for fn in fns:
            todo = [p for p in pieces if out[p] is None]
            if not todo:
                break
            out.update({p: t for p, t in (await fn(todo)).items() if t is not None})
        return out

    return mapper


@dataclass
class KeyTally:
    """How names became ids: ``mapped`` text names (distinct per list), ``unmapped`` ones kept as text."""

    mapped: int = 0
    unmapped: int = 0
    examples: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"mapped": self.mapped, "unmapped": self.unmapped, "examples": self.examples[:5]}

    def add(self, other: dict[str, Any]) -> None:
        self.mapped += int(other.get("mapped", 0))
        self.unmapped += int(other.get("unmapped", 0))
        self.examples += [str(e) for e in other.get("examples", [])][: 5 - len(self.examples)]


async def _table(names: set[str], mapper: Mapper | None, tally: KeyTally) -> dict[str, str]:
    text = sorted(n for n in names if not is_id(n))
    if not text or mapper is None:
        return {}
    ids = await mapper(text)
    table: dict[str, str] = {}
    for piece in text:
        tid = ids.get(piece)
        if tid is None:
            tally.unmapped += 1
            if len(tally.examples) < 5:
                tally.examples.append(piece)
        else:
            tally.mapped += 1
            table[piece] = f"{ID_PREFIX}{tid}"
    return table


def _rekey(d: TokenDist, table: dict[str, str]) -> TokenDist:
    top: dict[str, float] = {}
    for name, lp in d.top.items():
        key = table.get(name, name)
        top[key] = max(lp, top.get(key, lp))  # two texts of one id (a lossy rendering): the larger
    return TokenDist(table.get(d.token, d.token), d.logprob, top)


def _names(dists: Sequence[TokenDist | None]) -> set[str]:
    out: set[str] = set()
    for d in dists:
        if d is not None:
            out.add(d.token)
            out.update(d.top)
    return out


async def dists_by_ids(dists: Sequence[TokenDist], mapper: Mapper | None, tally: KeyTally) -> list[TokenDist]:
    table = await _table(_names(dists), mapper, tally)
    return [_rekey(d, table) for d in dists] if table else list(dists)


async def prompt_by_ids(lp: PromptLogprobs, mapper: Mapper | None, tally: KeyTally) -> PromptLogprobs:
    names = _names(lp.positions) | set(lp.tokens)
    table = await _table(names, mapper, tally)
    if not table:
        return lp
    positions = [None if d is None else _rekey(d, table) for d in lp.positions]
    return PromptLogprobs([table.get(t, t) for t in lp.tokens], positions, lp.shift, lp.source)


def check_keys(base: Sequence[TokenDist | None], cand: Sequence[TokenDist | None], where: str) -> None:
    """Both sides' keys must be of one kind: ids against text cannot be compared."""
    kinds = [{is_id(n) for n in _names(side)} for side in (base, cand)]
    if kinds[0] and kinds[1] and len(kinds[0] | kinds[1]) > 1 and not (kinds[0] & kinds[1]):
        raise ProbeError(
            f"{where}: one side names tokens by id and the other by text, and neither side can map text to ids",
            "compare against a server with /tokenize (or one that returns token ids)",
        )


async def check_same_tokenizer(baseline: Backend, candidate: Backend) -> None:
    """Refuse two engines whose tokenizers differ: one conversation rendered by both must give the same ids."""
    a, b = await baseline.render(TOKENIZER_CHECK), await candidate.render(TOKENIZER_CHECK)
    if isinstance(a, str) or isinstance(b, str):
        return  # a side without token ids: the prompt logprobs' tokens are compared instead
    a, b = list(a), list(b)
    if a != b:
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        raise UsageError(
            f"{candidate.name} and {baseline.name} tokenize differently ({len(b)} vs {len(a)} tokens for one "
            f"conversation, first difference at token {first}): they are not the same model",
            "compare engines that serve the same model and tokenizer",
        )
