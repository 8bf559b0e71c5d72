"""The unified-diff parser and applier: real formats, clear errors, and fuzzing (no crash on any input)."""

from __future__ import annotations

import contextlib
import difflib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speedtrap._errors import PatchError, SpeedtrapError
from speedtrap.triage import DiffError, apply_patch, parse_diff
from speedtrap.triage.source.diff import decode_diff

OLD = "a = 1\nb = 2\nc = 3\nd = 4\ne = 5\n"
NEW = "a = 1\nb = 2\nc = 30\nd = 4\ne = 5\nf = 6\n"


def udiff(old: str, new: str, a: str = "a/x.py", b: str = "b/x.py", n: int = 3) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), a, b, n=n))


def test_parses_git_diff_and_applies() -> None:
    text = "diff --git a/x.py b/x.py\nindex 111..222 100644\n" + udiff(OLD, NEW)
    [fp] = parse_diff(text)
    assert (fp.old_path, fp.new_path) == ("x.py", "x.py")
    assert [ln.text for ln in fp.added()] == ["c = 30", "f = 6"]
    assert [ln.text for ln in fp.removed()] == ["c = 3"]
    applied = apply_patch(fp, OLD, "tree")
    assert applied.text == NEW
    assert applied.added == {3, 6} and applied.removed == {3}


def test_format_patch_mail_headers_new_file_and_binary() -> None:
    text = (
        "From 0123 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] make it faster\n\n--- a commit message line\n"
        "---\n x.py | 1 +\n\n"
        "diff --git a/x.py b/x.py\n" + udiff(OLD, NEW) + "diff --git a/new.py b/new.py\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/new.py\n@@ -0,0 +1,2 @@\n+x = 1\n+y = 2\n"
        "diff --git a/img.png b/img.png\nBinary files a/img.png and b/img.png differ\n-- \n2.43.0\n"
    )
    files = parse_diff(text)
    assert [f.path for f in files] == ["x.py", "new.py", "img.png"]
    assert files[1].old_path is None and apply_patch(files[1], None, "t").text == "x = 1\ny = 2\n"
    assert files[2].binary and not files[2].hunks


def test_plain_diff_with_timestamps_and_no_newline_marker() -> None:
    text = (
        "--- x.py\t2024-01-01 00:00:00\n+++ x.py\t2024-01-02 00:00:00\n@@ -1,2 +1,2 @@\n a = 1\n-b = 2\n"
        "\\ No newline at end of file\n+b = 3\n\\ No newline at end of file\n"
    )
    [fp] = parse_diff(text)
    assert fp.path == "x.py"
    assert apply_patch(fp, "a = 1\nb = 2", "t").text == "a = 1\nb = 3"


def test_applies_with_offset_and_reports_it() -> None:
    [fp] = parse_diff(udiff(OLD, NEW))
    shifted = "# header\n# more\n" + OLD
    applied = apply_patch(fp, shifted, "tree")
    assert applied.text == "# header\n# more\n" + NEW
    assert applied.offsets == (2,)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "holds no unified diff"),
        ("hello\nworld\n", "holds no unified diff"),
        ("--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n-b\n", "hunk ends early"),
        ("--- a/x\n+++ b/x\n@@ -1,1 +1,1 @@\n*junk\n", "does not fit the hunk"),
        ("--- a/x\n+++ b/x\n@@ bad header @@\n", "bad hunk header"),
        ("--- a/x\n+++ b/x\nno hunks here\n", "has no hunks"),
        ("@@ -1 +1 @@\n-a\n+b\n", "no `---`/`+++` file header"),
        ("--- /dev/null\n+++ /dev/null\n@@ -1 +1 @@\n-a\n+b\n", "both file paths"),
        ("a\x00b", "binary"),
    ],
)
def test_malformed_diffs_raise_one_line_errors(text: str, needle: str) -> None:
    with pytest.raises(DiffError) as info:
        parse_diff(text, "patch file 'p.diff'")
    message = info.value.one_line()
    assert needle in message and "\n" not in message


def test_binary_bytes_are_refused() -> None:
    with pytest.raises(DiffError, match="binary"):
        decode_diff(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "patch file 'x.png'")
    assert decode_diff(b"--- a\n", "f") == "--- a\n"


def test_diff_that_does_not_apply_names_the_hunk() -> None:
    [fp] = parse_diff(udiff(OLD, NEW))
    with pytest.raises(PatchError) as info:
        apply_patch(fp, "completely\ndifferent\nfile\n", "the tree")
    assert "does not apply to x.py in the tree" in str(info.value) and "c = 3" in str(info.value)


def test_missing_file_is_a_patch_error() -> None:
    [fp] = parse_diff(udiff(OLD, NEW))
    with pytest.raises(PatchError, match="not in"):
        apply_patch(fp, None, "the tree")


# --- fuzzing -----------------------------------------------------------------------------------

_line = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n\x00"), max_size=12)
_diffish = st.lists(
    st.one_of(
        _line,
        st.sampled_from(["--- a/x.py", "+++ b/x.py", "@@ -1,2 +1,2 @@", "@@ -1 +1 @@", "diff --git a/x b/x", " ", "-"]),
        _line.map(lambda s: "+" + s),
        _line.map(lambda s: "-" + s),
        _line.map(lambda s: " " + s),
        st.sampled_from(["\\ No newline at end of file", "Binary files a/x and b/x differ", "GIT binary patch"]),
        st.from_regex(r"@@ -[0-9]{1,9}(,[0-9]{1,9})? \+[0-9]{1,9}(,[0-9]{1,9})? @@.*", fullmatch=True),
    ),
    max_size=30,
).map("\n".join)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=400), _diffish))
def test_fuzz_parse_never_crashes(text: str) -> None:
    try:
        files = parse_diff(text)
    except DiffError as exc:
        assert "\n" not in exc.one_line()
        return
    for fp in files:
        for hunk in fp.hunks:
            assert sum(ln.op != "+" for ln in hunk.lines) == hunk.old_count
            assert sum(ln.op != "-" for ln in hunk.lines) == hunk.new_count
        with contextlib.suppress(SpeedtrapError):
            apply_patch(fp, text, "fuzz")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_fuzz_bytes_never_crash(data: bytes) -> None:
    with contextlib.suppress(DiffError):
        parse_diff(decode_diff(data, "fuzz"))


_lines = st.lists(st.sampled_from(["a", "b", "c", "x = 1", "", "    return y", "# c"]), max_size=25)


@settings(max_examples=300, deadline=None)
@given(_lines, _lines, st.integers(0, 3), _lines)
def test_fuzz_roundtrip_difflib(old: list[str], new: list[str], context: int, prefix: list[str]) -> None:
    old_text = "".join(line + "\n" for line in old)
    new_text = "".join(line + "\n" for line in new)
    text = udiff(old_text, new_text, n=context)
    if not text:
        return
    [fp] = parse_diff(text)
    applied = apply_patch(fp, old_text, "t")
    assert applied.text == new_text
    assert all(new[i - 1] is not None for i in applied.added) and max(applied.added, default=0) <= len(new)
    # With unrelated lines in front, the hunks still apply (at an offset) when they carry context.
    head = "".join(f"#prefix {p}\n" for p in prefix)
    shifted = (head + old_text).split("\n")
    blocks = [h.old_block() for h in fp.hunks]
    unique = all(sum(shifted[i : i + len(b)] == b for i in range(len(shifted))) == 1 for b in blocks)
    if context and old and unique:  # an ambiguous hunk may match elsewhere, as with GNU patch
        assert apply_patch(fp, head + old_text, "t").text == head + new_text
