"""Text from results.json made safe for each output: visible, Markdown-inert, link-safe.

Every string of a results document is untrusted: a plugin under test writes the reasons, and a
results.json can be crafted by hand. Three rules, applied once where the view is built:

- visible(): characters a reader cannot see, or that act on a terminal or a parser, are shown
  instead of passed on: C0 controls and DEL as their Unicode control pictures (ESC -> U+241B),
  C1 controls, bidi overrides, lone surrogates and non-characters as \\xNN / \\uNNNN. Tab and
  newline stay (every one-line context collapses them).
- md_text(): Markdown with no live syntax: no raw HTML, no entity, no link, image or code span
  of the input's making, no table break; the text reads the same once rendered.
- href(): a link target that is a relative path, percent-encoded segment by segment, so no
  scheme (javascript:), no parenthesis and no quote can come through.
"""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import quote

from markupsafe import Markup

# C0 except tab and newline, DEL, C1, bidi embeddings/overrides/isolates, the line and paragraph
# separators, BOM, lone surrogates and the non-characters XML 1.0 forbids.
_HIDDEN = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ufeff"
    "\ud800-\udfff\ufffe\uffff]"
)
_PICTURE_DEL = "\u2421"


def _show(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)  # U+2400..U+241F: the control pictures
    if code == 0x7F:
        return _PICTURE_DEL
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str) -> str:
    """text with every hidden or acting character shown (see the module's first rule)."""
    return _HIDDEN.sub(_show, text)


def visible_tree(value: Any) -> Any:
    """A copy of a parsed JSON document with visible() applied to every string and key.

    The loader has already bounded the depth (hvconform.contract.strict_json), so recursion
    here is at most that deep.
    """
    if isinstance(value, str):
        return visible(value)
    if isinstance(value, dict):
        return {visible(str(k)): visible_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [visible_tree(v) for v in value]
    return value


class MdSafe(str):
    """Markdown that is already escaped (or written by the template itself)."""


# Backslash escapes are CommonMark for any ASCII punctuation; these are the ones that can start
# live syntax inside a line: emphasis, strike-through, code spans, links and images (`!` is inert
# once `[` is escaped), table cells. An underscore inside a word cannot start emphasis, so
# snake_case names stay as they are. < > & become entities: no raw HTML, no entity of the input's.
_MD_PUNCT = re.compile(r"([\\`*\[\]|~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9]))")
_MD_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def md_escape(value: object) -> str:
    """Escape one value for a Markdown line: visible, newlines folded, no live syntax."""
    text = visible(str(value)).replace("\n", " ").replace("\t", " ")
    text = _MD_PUNCT.sub(r"\\\1", text)
    return re.sub("[&<>]", lambda m: _MD_ENTITIES[m.group()], text)


def md_text(value: object) -> MdSafe:
    """A value as one Markdown line (runs of white space folded to one)."""
    return MdSafe(md_escape(" ".join(visible(str(value)).split())))


def md_code(value: object) -> MdSafe:
    """A value as a code span: backticks in it become quotes (a span cannot be broken out of),
    pipes are escaped for table cells (GitHub splits cells before it finds code spans)."""
    text = " ".join(visible(str(value)).split()).replace("`", "'").replace("|", "\\|")
    return MdSafe(f"`{text}`") if text else MdSafe("")


def md_ticks(value: object) -> MdSafe:
    """md_text, except that `backticked` words become code spans (as the HTML's ticks filter):
    scope limits name checks that way. A span cannot hold live syntax, so input that brings its
    own backticks gains code spans at most."""
    pieces = re.split(r"`([^`]+)`", " ".join(visible(str(value)).split()))
    return MdSafe("".join(md_code(p) if i % 2 else md_escape(p) for i, p in enumerate(pieces)))


_HREF = re.compile(r"[A-Za-z0-9%._~/-]*")


def md_url(value: object) -> MdSafe:
    """A link target made by href() passes as it is; anything else is encoded by href()."""
    target = str(value)
    return MdSafe(target if _HREF.fullmatch(target) else href(target))


def md_finalize(value: object) -> str:
    """Jinja's finalize for Markdown: every {{ }} is escaped unless a filter already did it."""
    if isinstance(value, MdSafe | Markup):
        return str(value)
    return md_escape("" if value is None else value)


def _segment_bytes(segment: str) -> bytes:
    try:
        return os.fsencode(segment)  # a file name that is not UTF-8 keeps its own bytes
    except UnicodeEncodeError:
        return segment.encode("utf-8", "backslashreplace")


def href(target: str) -> str:
    """A relative link target, each segment percent-encoded: ':' becomes %3A, so no scheme
    (javascript:) can be formed, and no parenthesis, quote, space or angle bracket survives."""
    path = "/".join(quote(_segment_bytes(s), safe="") for s in target.split("/"))
    return path or "."
