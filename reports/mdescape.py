"""Escaping for Markdown: every value that comes from data (labels, summaries, argv, errors) passes here.

A label value is whatever a scraped server or a dump says it is: it may hold a newline (a new
heading), `|` (a broken table), `<img onerror=...>` (HTML in a GitHub preview) or emphasis
characters. `escape_md` makes any such value inert text; `fenced` picks a code fence that the
block's own backticks cannot close.
"""

from __future__ import annotations

import re

# line breaks of any kind would start a new Markdown block (a heading, a list, a table row)
_LINE_BREAKS = re.compile(r"[\r\n\v\f\x85\u2028\u2029]+")
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")
# punctuation that can open inline markup anywhere: emphasis, links, code, strikethrough, headings
_INLINE = re.compile(r"([\\`*\[\]#~|!])")
# an underscore opens emphasis only at a word's edge (snake_case stays readable in the source)
_EDGE_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
# what could start a block when the value begins a line: a list item, a rule, a setext underline
_BLOCK_START = re.compile(r"^(\s*)([-+=]|\d{1,9}[.)](?=\s|$))")
_CODE_UNSAFE = re.compile(r"[`\\|]")


def escape_md(value: object, code: bool = False) -> str:
    """`value` as inert Markdown: text that renders as itself, inside a table cell or anywhere in a line.

    code=True renders it as a code span when that is safe (no backtick, backslash or pipe inside),
    else as escaped text: escape_md('a|b') -> 'a\\|b'; escape_md('x_y', code=True) -> '`x_y`'.
    """
    text = _CONTROL.sub("\ufffd", _LINE_BREAKS.sub(" ", str(value)))
    if code and text.strip() and not _CODE_UNSAFE.search(text):
        return f"`{text}`"  # inside a code span <, & and * are literal: only its own delimiters matter
    text = _INLINE.sub(r"\\\1", text)
    text = _EDGE_UNDERSCORE.sub(r"\\_", text)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    # a backslash escapes punctuation only: before the '-' of '- x', after the digits of '1. x'
    return _BLOCK_START.sub(lambda m: m[1] + (m[2][:-1] + "\\" + m[2][-1]), text, count=1)


def escape_md_with_code(text: str) -> str:
    """Our own sentences that mark names in `backticks`: each part escaped, the backticked ones as code."""
    parts = str(text).split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick (from data): the last one is plain text
        parts[-2:] = ["`".join(parts[-2:])]
    return "".join(escape_md(p, code=bool(i % 2)) if p else "" for i, p in enumerate(parts))


def fenced(lines: list[str], info: str = "") -> list[str]:
    """A fenced code block around `lines`, its fence longer than any backtick run inside them."""
    body = [_LINE_BREAKS.sub(" ", str(line)) for line in lines]
    longest = max((len(run) for line in body for run in re.findall(r"`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + info, *body, fence]
