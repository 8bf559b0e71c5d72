"""A small, safe Markdown-to-HTML converter for the triage plan embedded in the report.

It knows what the plan uses: headings, pipe tables, bullet and numbered lists (with indented
continuation lines), fenced code and paragraphs; inline code and bold. Every piece of text is
escaped first, so no markup in the input reaches the page.
"""

from __future__ import annotations

import html
import re

_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*([^*]+)\*\*")
_ITEM = re.compile(r"^(\s*)(?:[-*]|(\d+)\.)\s+(.*)$")


def inline(text: str) -> str:
    """Escape ``text``, then turn `code` and **bold** into tags."""
    parts = _CODE.split(text)
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(f"<code>{html.escape(part)}</code>")
        else:
            out.append(_BOLD.sub(r"<strong>\1</strong>", html.escape(part)))
    return "".join(out)


def _table(rows: list[str]) -> str:
    cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in rows]
    head, body = cells[0], [r for r in cells[1:] if not all(set(c) <= set("-: ") for c in r)]
    out = ["<table><thead><tr>", *(f"<th>{inline(c)}</th>" for c in head), "</tr></thead><tbody>"]
    for row in body:
        out.append("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in row) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def markdown_to_html(text: str, heading_offset: int = 2) -> str:
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if not stripped:
            i += 1
            continue
        if stripped.startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith("```"):
                j += 1
            out.append(f"<pre><code>{html.escape(chr(10).join(lines[i + 1 : j]))}</code></pre>")
            i = j + 1
            continue
        heading = re.match(r"^(#{1,6})\s+(.*)$", stripped)
        if heading:
            level = min(6, len(heading.group(1)) + heading_offset)
            out.append(f"<h{level}>{inline(heading.group(2))}</h{level}>")
            i += 1
            continue
        if stripped.startswith("|"):
            j = i
            while j < len(lines) and lines[j].strip().startswith("|"):
                j += 1
            out.append(_table(lines[i:j]))
            i = j
            continue
        item = _ITEM.match(line)
        if item:
            tag = "ol" if item.group(2) else "ul"
            items: list[str] = []
            while i < len(lines):
                m = _ITEM.match(lines[i])
                if m and bool(m.group(2)) == (tag == "ol"):
                    items.append(inline(m.group(3)))
                elif lines[i].startswith((" ", "\t")) and lines[i].strip() and items:
                    items[-1] += "<br>" + inline(lines[i].strip())
                else:
                    break
                i += 1
            out.append(f"<{tag}>" + "".join(f"<li>{it}</li>" for it in items) + f"</{tag}>")
            continue
        para = [stripped]
        i += 1
        while i < len(lines) and lines[i].strip() and not re.match(r"^(#|\||```|\s*[-*]\s|\s*\d+\.\s)", lines[i]):
            para.append(lines[i].strip())
            i += 1
        out.append("<p>" + inline(" ".join(para)) + "</p>")
    return "\n".join(out)
