"""Code blocks taken from README.md, so that tests run the README's examples as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def code_blocks(heading: str, language: str = "python") -> list[str]:
    """The fenced `language` blocks of the README section titled `heading` (a `## ` title)."""
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    if match is None:
        raise LookupError(f"README.md has no section '## {heading}'")
    return re.findall(rf"^```{language}\n(.*?)^```", match.group(1), re.M | re.S)
