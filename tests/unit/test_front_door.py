"""The front door stays short (issue 31): README.md is what it is and how to run it; the rest is the docs site."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def _prose_words(text: str) -> int:
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return len(" ".join(line for line in text.splitlines() if not line.startswith("    ")).split())


def test_the_readme_stays_under_1500_words_of_prose():
    assert _prose_words((REPO / "README.md").read_text()) <= 1500


def test_every_docs_page_is_in_the_sites_navigation_and_every_readme_link_resolves():
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    pages = {next(iter(item.values())) for item in nav}
    assert pages == {p.name for p in (REPO / "docs").glob("*.md")}
    for target in re.findall(r"\]\(([^)#]+)", (REPO / "README.md").read_text()):
        assert (REPO / target).exists(), target
