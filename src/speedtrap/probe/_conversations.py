"""Multi-turn chat conversations with facts planted at chosen depths.

A conversation is a system message and filler turns (the user asks, the assistant answers with a
paragraph of prose); each fact is told once, by the user, at the start of the filler turn at its
depth, and each question asks for one fact in a final user turn. The assistant never repeats a
fact: a model that copies its own earlier words would otherwise pass without recalling anything.
Everything comes from a seeded RNG: the same seed gives the same conversations on
every backend. Only the number of filler turns depends on the backend (its tokenizer), chosen so
that the whole prompt is as long as possible without passing the target length.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from speedtrap.data import filler_paragraphs

Message = dict[str, str]
CountTokens = Callable[[list[Message]], Awaitable[int]]

SYSTEM = "You are a helpful assistant. Remember the facts the user tells you."

KEYS = (
    "the blue door",
    "the garden shed",
    "the red locker",
    "the north gate",
    "the office safe",
    "the bike lock",
    "the storage unit",
    "the wine cellar",
    "the back office",
    "the gym locker",
    "the server room",
    "the attic hatch",
    "the boat house",
    "the tool chest",
    "the side entrance",
    "the roof terrace",
)

ASKS = (
    "Tell me something interesting.",
    "Can you tell me about another topic?",
    "Tell me more about something else.",
    "What else can you tell me?",
    "Share another short piece of knowledge, please.",
)


@dataclass(frozen=True)
class Fact:
    key: str  # "the blue door"
    value: str  # a random 6-digit number
    depth: float  # 0 = at the start of the conversation, 1 = just before the question

    def statement(self) -> str:
        return f"Please remember this: the access code for {self.key} is {self.value}."

    def question(self) -> str:
        return f"What is the access code for {self.key}? Answer with the number only."

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "depth": self.depth}


@dataclass(frozen=True)
class Conversation:
    """One conversation prefix (system, filler and fact turns) and its questions, one per fact."""

    id: str
    length: int  # the target length in tokens
    facts: tuple[Fact, ...]
    turns: tuple[Message, ...]  # without the question

    def messages(self, fact: Fact) -> list[Message]:
        """The request asking for one fact: the shared prefix, then the question."""
        return [*self.turns, {"role": "user", "content": fact.question()}]

    def transcript(self, fact: Fact) -> list[Message]:
        """The request plus the correct answer as the assistant's turn (a teacher-forcing sequence)."""
        return [*self.messages(fact), {"role": "assistant", "content": fact.value}]


def plant_facts(rng: random.Random, depths: Sequence[float]) -> tuple[Fact, ...]:
    """One fact per depth, with distinct keys and distinct random 6-digit values."""
    if len(depths) > len(KEYS):
        raise ValueError(f"at most {len(KEYS)} depths per conversation")
    keys = rng.sample(KEYS, len(depths))
    values: set[str] = set()
    facts = []
    for key, depth in zip(keys, depths, strict=True):
        value = str(rng.randrange(100_000, 1_000_000))
        while value in values:
            value = str(rng.randrange(100_000, 1_000_000))
        values.add(value)
        facts.append(Fact(key, value, depth))
    return tuple(facts)


def filler_turns(rng: random.Random, count: int) -> list[tuple[Message, Message]]:
    """``count`` (user asks, assistant answers with a paragraph) pairs; paragraphs cycle in shuffled rounds."""
    paragraphs = filler_paragraphs()
    order: list[int] = []
    while len(order) < count:
        block = list(range(len(paragraphs)))
        rng.shuffle(block)
        order.extend(block)
    return [
        ({"role": "user", "content": ASKS[rng.randrange(len(ASKS))]}, {"role": "assistant", "content": paragraphs[i]})
        for i in order[:count]
    ]


def assemble(facts: Sequence[Fact], fillers: Sequence[tuple[Message, Message]]) -> tuple[Message, ...]:
    """The prefix: the system message, then filler turns; a fact at depth d opens the user message of
    filler turn round(d * (turns - 1)). Without filler turns, the facts make a user turn of their own,
    with no assistant reply after it: a canned reply ("Understood.") is what a damaged model copies
    as its answer, which would measure the copying, not the recall."""
    if not fillers:
        told = " ".join(f.statement() for f in sorted(facts, key=lambda f: f.depth))
        return ({"role": "system", "content": SYSTEM}, {"role": "user", "content": told})
    slots: dict[int, list[Fact]] = {}
    for fact in sorted(facts, key=lambda f: f.depth):
        slots.setdefault(round(fact.depth * (len(fillers) - 1)), []).append(fact)
    turns: list[Message] = [{"role": "system", "content": SYSTEM}]
    for i, (ask, answer) in enumerate(fillers):
        told = " ".join(f.statement() for f in slots.get(i, []))
        turns.append({"role": "user", "content": f"{told} {ask['content']}" if told else ask["content"]})
        turns.append(answer)
    return tuple(turns)


async def build_conversation(
    conv_id: str, length: int, depths: Sequence[float], seed: int, count_tokens: CountTokens
) -> tuple[Conversation, int]:
    """The conversation with the most filler turns whose longest request fits in ``length`` tokens.

    Returns it with that request's token count (as the backend counts). The facts and the filler
    order depend only on ``seed``; the number of filler turns is searched with few counts (a server
    without ``/tokenize`` counts by running the prompt): a linear model of tokens per character,
    fitted on the counts so far, guesses it, and single steps settle the boundary.
    """
    rng = random.Random(seed)
    facts = plant_facts(rng, depths)
    fillers = filler_turns(rng, max(1, length // 16))
    longest = max(facts, key=lambda f: len(f.question()))
    counted: dict[int, int] = {}

    async def tokens_with(n: int) -> int:
        if n not in counted:
            turns = assemble(facts, fillers[:n])
            counted[n] = await count_tokens([*turns, {"role": "user", "content": longest.question()}])
        return counted[n]

    size = [0]  # characters of the first n filler turns, plus a per-turn allowance for the template
    for user, assistant in fillers:
        size.append(size[-1] + len(user["content"]) + len(assistant["content"]) + 40)
    base = await tokens_with(0)

    def guess(tokens_per_char: float) -> int:
        return max(n for n in range(len(size)) if base + tokens_per_char * size[n] <= length or n == 0)

    n = guess(0.3)
    for _ in range(4):  # refit on the last count until the guess is stable
        slope = (await tokens_with(n) - base) / size[n] if n else 0.3
        better = guess(max(slope, 1e-3))
        if better == n or better in counted:
            n = better
            break
        n = better
    if await tokens_with(n) <= length:
        while n < len(fillers) and await tokens_with(n + 1) <= length:
            n += 1
    else:
        while n > 0 and await tokens_with(n) > length:
            n -= 1
    return Conversation(conv_id, length, facts, assemble(facts, fillers[:n])), await tokens_with(n)
