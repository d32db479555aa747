"""MkDocs hook: markdown lists as this repo's docstrings and pages write them, for the docs and the API page.

Python-Markdown starts a list only after a blank line and nests one only at 4 spaces; the docstrings
write `Layouts read:` with `- ...` on the next line, and nest at 2 spaces. A preprocessor, on every page
and every docstring mkdocstrings renders, inserts that blank line and re-indents nested items to 4 spaces
(fenced code untouched).
"""

from __future__ import annotations

import re

from markdown import Extension
from markdown.preprocessors import Preprocessor
from mkdocs.plugins import event_priority

ITEM = re.compile(r"^( *)([-*+]|\d+[.)]) +\S")
FENCE = re.compile(r"^ *(`{3,}|~{3,})")
INDENT = 4  # what Python-Markdown nests at


def sane_lists(lines: list[str]) -> list[str]:
    """`lines` with a blank line before each list that follows a paragraph line, and nested items at 4 spaces."""
    out: list[str] = []
    fence = None
    items: list[int] = []  # the source indents of the open list items, outermost first
    blank_before = True
    for line in lines:
        if fence is not None:
            out.append(line)
            if line.strip().startswith(fence):
                fence = None
            continue
        opened = FENCE.match(line)
        if opened:
            fence = opened.group(1)
            out.append(line)
            continue
        if not line.strip():
            out.append(line)
            blank_before = True
            continue
        indent = len(line) - len(line.lstrip(" "))
        item = ITEM.match(line)
        if item and not blank_before and not items and item.group(2)[0].isdigit() and item.group(2)[:-1] != "1":
            item = None  # as CommonMark: only "1." starts a list inside a paragraph (a wrapped "2019. The ..." is text)
        if item and not items and indent < INDENT:
            if not blank_before:
                out.append("")
            items = [indent]
        elif item and items:
            while items and indent < items[-1]:
                items.pop()
            if not items or indent > items[-1]:
                items.append(indent)
        elif items and (line.startswith("#") or (blank_before and indent == 0)):
            items = []  # the list ended
        if items and len(items) > 1:
            offset = indent - items[-1] if not item else 0
            line = " " * (INDENT * (len(items) - 1) + max(offset, 0)) + line.lstrip(" ")
        out.append(line)
        blank_before = False
    return out


class _SaneLists(Preprocessor):
    def run(self, lines: list[str]) -> list[str]:
        return sane_lists(lines)


class SaneListsExtension(Extension):
    def extendMarkdown(self, md):  # noqa: N802 (Python-Markdown's name)
        md.preprocessors.register(_SaneLists(md), "taser_sane_lists", 28)  # after normalize_whitespace (30), before fenced code (25)


@event_priority(100)  # before mkdocstrings reads the extensions for its docstrings
def on_config(config):
    config.markdown_extensions.append(SaneListsExtension())
    return config
