"""mkdocs hook: links from the docs to files outside docs/ (``../bench/README.md``) become
the file's path in the source tree, since the site does not carry those files. Any other link
that does not resolve still fails the strict build."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

LINK = re.compile(r"\[([^\]]+)\]\((\.\./[^)#\s]+)(#[^)\s]*)?\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs_dir = Path(config["docs_dir"]).resolve()
    root = docs_dir.parent
    here = (docs_dir / page.file.src_path).parent

    def outside(match: re.Match[str]) -> str:
        target = (here / match.group(2)).resolve()
        if target.is_relative_to(docs_dir) or not target.is_relative_to(root):
            return match.group(0)
        if not target.exists():
            return match.group(0)  # left for mkdocs to report as broken
        return f"{match.group(1)} (`{target.relative_to(root)}` in the source tree)"

    return LINK.sub(outside, markdown)
