"""The corpus split by incident into a development half and a held-out half, fixed for every later change.

The rule: the incidents in the order they were added (``corpus.ORDER``, append-only), the first to the
development half, the second to the held-out half, and so on alternately (an incident at an even 0-based
position is developed on, at an odd one held out). It reads nothing but the order, so an incident keeps its half
when incidents are appended after it, and pairs added together fall into both halves.

The halves are recorded below in full as well, so a change to the order (an incident removed, moved or inserted
in the middle) that would move an incident from one half to the other fails ``check()`` (and the test
``tests/triage/test_incident_split.py``) instead of silently re-splitting. New incidents are appended to
``ORDER`` and to the half the rule gives them here.

The held-out half is read only to measure: a rule of triage is changed on what the development half shows, and
a rule written for one incident's shape is not done until the held-out figures (``--half heldout``) hold.
"""

from __future__ import annotations

RULE = "alternate in the order added (corpus.ORDER): even 0-based positions to development, odd ones held out"

DEV = (
    "vllm-45037",
    "vllm-52050",
    "vllm-25447",
    "vllm-14809",
    "sglang-2048",
    "sglang-7233",
    "sglang-8770",
    "sglang-35152",
    "llama.cpp-14892",
    "vllm-52692",
    "sglang-10400",
    "llama.cpp-13101",
    "sglang-1779",
    "vllm-18807",
    "llama.cpp-13260",
    "sglang-33558",
    "llama.cpp-13870",
    "sglang-8685",
    "sglang-19247",
    "vllm-43769",
    "vllm-24132-dots1",
    "sglang-6274",
    "vllm-13232",
    "vllm-34353",
    "vllm-34813",
    "sglang-33764",
    "vllm-12002",
    "vllm-11921",
    "sglang-13495",
)

HELD_OUT = (
    "vllm-38822",
    "vllm-45720",
    "vllm-19784",
    "vllm-23123",
    "sglang-2048-0.5.23",
    "sglang-8333",
    "sglang-31762",
    "sglang-38963",
    "sglang-18396",
    "vllm-31380",
    "llama.cpp-10015",
    "sglang-29278",
    "vllm-3653",
    "sglang-20819",
    "vllm-16439",
    "sglang-26203",
    "vllm-16912",
    "vllm-43770",
    "llama.cpp-14850",
    "vllm-24132-glm4",
    "vllm-19592",
    "sglang-31232",
    "vllm-16311",
    "vllm-53877",
    "sglang-11791",
    "vllm-16801",
    "vllm-13474",
    "sglang-12186",
    "sglang-9884",
)

HALVES = ("dev", "heldout", "all")


def by_rule(order: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The development and held-out halves the rule gives for ``order``."""
    return order[0::2], order[1::2]


def check(order: tuple[str, ...]) -> None:
    """Refuse an order whose halves differ from the recorded ones (an incident would change half)."""
    dev, held = by_rule(order)
    if (dev, held) != (DEV, HELD_OUT):
        moved = sorted((set(dev) ^ set(DEV)) | (set(held) ^ set(HELD_OUT)))
        raise SystemExit(
            f"corpus split: the order and the recorded halves disagree on {moved}; append new incidents at the end "
            "of corpus.ORDER and to the half the rule gives them in split.py"
        )


def half_of(case_id: str) -> str:
    """``dev`` or ``heldout``."""
    if case_id in DEV:
        return "dev"
    if case_id in HELD_OUT:
        return "heldout"
    raise KeyError(case_id)


def in_half(case_id: str, half: str) -> bool:
    return half == "all" or half_of(case_id) == half
