"""The registry lists every rule; each rule's module holds the example it catches and has its tests; the
signal table in docs/triage.md is the one the registry generates."""

from __future__ import annotations

from pathlib import Path

from speedtrap.triage.registry import (
    READERS,
    RULES,
    TABLE_BEGIN,
    TABLE_END,
    docstring_has_example,
    replace_table,
    rule_modules,
    signal_table,
    unlisted,
)

REPO = Path(__file__).resolve().parents[2]


def test_every_module_of_the_rule_folders_is_a_listed_rule_or_a_reader() -> None:
    assert unlisted() == []
    assert {r.module for r in RULES} | set(READERS) <= set(rule_modules())  # nothing listed that is not there


def test_a_rule_left_out_of_the_list_is_found() -> None:
    dropped = RULES[3]
    assert unlisted(tuple(r for r in RULES if r is not dropped)) == [dropped.module]


def test_each_rule_has_its_example_and_its_tests() -> None:
    for rule in RULES:
        assert docstring_has_example(rule.module), rule.module
        assert rule.example(), rule.module
        assert rule.tests and all((REPO / t).is_file() for t in rule.tests), rule.tests
    assert len({r.module for r in RULES}) == len(RULES)


def test_the_docs_signal_table_is_generated_from_the_registry() -> None:
    page = (REPO / "docs" / "triage.md").read_text()
    assert TABLE_BEGIN in page and TABLE_END in page
    assert replace_table(page) == page, "stale: run python -m speedtrap.triage.registry docs/triage.md"
    for rule in RULES:
        assert f"| {rule.name} |" in page


def test_a_stale_table_is_found() -> None:
    page = (REPO / "docs" / "triage.md").read_text()
    begin = page.index(TABLE_BEGIN)
    stale = page.replace(signal_table(), signal_table().replace(f"| {RULES[0].name} |", "| guard gone |"))
    assert stale != page and replace_table(stale) == page and stale.index(TABLE_BEGIN) == begin
