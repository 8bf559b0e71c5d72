"""The small Markdown converter the report embeds the triage plan with: it never lets input markup through."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from speedtrap.report._mdhtml import markdown_to_html

OUR_TAGS = re.compile(r"</?(p|h[1-6]|table|thead|tbody|tr|th|td|ul|ol|li|pre|code|strong|br)>")

markdownish = st.lists(
    st.one_of(
        st.text(max_size=40),
        st.sampled_from(["# ", "## ", "- ", "1. ", "   ", "| a | b |", "|---|---|", "```", "`", "**", "<script>", "<"]),
    ),
    max_size=30,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(st.lists(markdownish, max_size=12).map("\n".join))
def test_no_input_markup_reaches_the_page(text: str) -> None:
    out = markdown_to_html(text)
    assert "<" not in OUR_TAGS.sub("", out)


def test_the_plan_constructs_it_knows() -> None:
    text = (
        "# Plan\n\nSome `code` and **bold**.\n\n| a | b |\n|---|---|\n| 1 | `x` |\n\n"
        "1. first\n   `cmd`\n- item\n\n```diff\n+ <b>\n```"
    )
    out = markdown_to_html(text)
    assert "<h3>Plan</h3>" in out
    assert "<code>code</code>" in out and "<strong>bold</strong>" in out
    assert "<table><thead><tr><th>a</th><th>b</th></tr></thead><tbody><tr><td>1</td><td><code>x</code></td></tr>" in out
    assert "<ol><li>first<br><code>cmd</code></li></ol>\n<ul><li>item</li></ul>" in out
    assert "<pre><code>+ &lt;b&gt;</code></pre>" in out
