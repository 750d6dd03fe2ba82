"""A version's conversion report as HTML: the converter's ``report.md`` rendered with
raw HTML off (everything in it is escaped), its plot links pointed at the console's
file route. Only the converter's own report files are ever served."""

from __future__ import annotations

from pathlib import Path

from markdown_it import MarkdownIt

from converters.report import REPORT_FILES

IMAGES = tuple(f for f in REPORT_FILES if f.endswith(".png"))

_markdown = MarkdownIt("commonmark", {"html": False}).enable("table")


def report_html(markdown: str, file_url: str) -> str:
    """``file_url``: the route of the report's files, ``{file}`` in it for the name.
    An image that is not one of the converter's plots is left out."""
    tokens = _markdown.parse(markdown)
    for token in tokens:
        for child in token.children or ():
            if child.type != "image":
                continue
            src = str(child.attrGet("src") or "")
            if src in IMAGES:
                child.attrSet("src", file_url.format(file=src))
                child.attrSet("loading", "lazy")
            else:  # nothing is fetched from elsewhere: its alt text stays
                child.type, child.children = "text", None
    return _markdown.renderer.render(tokens, _markdown.options, {})


def report_file(report: Path, name: str) -> Path | None:
    """The converter's file ``name`` beside ``report`` (one of :data:`REPORT_FILES`)."""
    if name not in REPORT_FILES:
        return None
    path = report.parent / name
    return path if path.is_file() else None
