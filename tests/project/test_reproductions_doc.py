"""docs/reproductions.md covers every recipe, and every recipe header is short and links there.

For each recipe under recipes/: the page has a heading with the explicit anchor named after the
recipe file (``{#fig6-forgetting-vs-similarity}`` for ``fig6_forgetting_vs_similarity.yaml``),
names the recipe's path, and shows a figure in that section (or in the section that encloses it,
when several recipes share one) that exists in docs/figures/ as a small PNG. The recipe's leading
comment block is at most 20 lines, its first line (``zoo recipes`` prints it) at most 100
characters, and one line links to ``docs/reproductions.md#<anchor>`` with an anchor the page has.
"""
from __future__ import annotations

import re

import pytest

from tests.conftest import REPO

DOC = REPO / "docs" / "reproductions.md"
FIGURES = REPO / "docs" / "figures"
RECIPES = sorted((REPO / "recipes").rglob("*.yaml"))
IDS = [str(p.relative_to(REPO / "recipes")) for p in RECIPES]

MAX_HEADER_LINES = 20
MAX_FIRST_LINE = 100
MAX_FIGURE_BYTES = 300_000
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

HEADING = re.compile(r"^(#{1,6})\s+.*?\{#([A-Za-z0-9_-]+)\}\s*$")
FIGURE_LINK = re.compile(r"!\[[^\]]*\]\((figures/[^)\s]+)\)")
DOC_LINK = re.compile(r"docs/reproductions\.md#([A-Za-z0-9_-]+)")


def _anchor(recipe) -> str:
    return recipe.stem.replace("_", "-")


def _sections() -> dict[str, tuple[str, str]]:
    """anchor -> (its own section's text, the enclosing section's text or "").

    A section runs from its heading to the next heading of the same or a higher level."""
    lines = DOC.read_text().splitlines()
    heads = []  # (line index, level, anchor)
    for i, line in enumerate(lines):
        if m := HEADING.match(line):
            heads.append((i, len(m.group(1)), m.group(2)))
    out = {}
    for j, (i, level, anchor) in enumerate(heads):
        end = next((k for k, lv, _ in heads[j + 1:] if lv <= level), len(lines))
        parent = next(((k, lv) for k, lv, _ in reversed(heads[:j]) if lv < level), None)
        enclosing = ""
        if parent is not None:
            p_end = next((k for k, lv, _ in heads if k > parent[0] and lv <= parent[1]), len(lines))
            enclosing = "\n".join(lines[parent[0]:p_end])
        out[anchor] = ("\n".join(lines[i:end]), enclosing)
    return out


def _header(recipe) -> list[str]:
    """The recipe's leading comment lines (blank lines inside the block are not counted)."""
    header = []
    for line in recipe.read_text().splitlines():
        if line.startswith("#"):
            header.append(line)
        elif line.strip():
            break
    return header


def test_anchors_are_unique():
    anchors = [m.group(2) for line in DOC.read_text().splitlines() if (m := HEADING.match(line))]
    assert len(anchors) == len(set(anchors)), sorted(a for a in anchors if anchors.count(a) > 1)


@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_doc_has_the_recipe_with_its_figure(recipe):
    sections = _sections()
    anchor = _anchor(recipe)
    assert anchor in sections, f"docs/reproductions.md has no heading with {{#{anchor}}}"
    own, enclosing = sections[anchor]
    path = str(recipe.relative_to(REPO))
    assert path in own or path in enclosing, f"the section {anchor} does not name {path}"
    links = FIGURE_LINK.findall(own) or FIGURE_LINK.findall(enclosing)
    assert links, f"the section {anchor} shows no figure"
    for link in links:
        figure = DOC.parent / link
        assert figure.is_file(), f"{link} (section {anchor}) is not in docs/figures/"
        assert figure.parent == FIGURES
        data = figure.read_bytes()
        assert data.startswith(PNG_SIGNATURE), f"{link} is not a PNG"
        assert len(data) < MAX_FIGURE_BYTES, f"{link} has {len(data)} bytes (limit {MAX_FIGURE_BYTES})"


@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_recipe_header_is_short_and_links_to_the_doc(recipe):
    header = _header(recipe)
    assert header, f"{recipe.name} has no header"
    assert len(header) <= MAX_HEADER_LINES, f"{recipe.name}: {len(header)} header lines"
    first = header[0]
    assert len(first) <= MAX_FIRST_LINE, f"{recipe.name}: first line has {len(first)} characters"
    links = [m.group(1) for line in header for m in DOC_LINK.finditer(line)]
    assert links, f"{recipe.name}: no link to docs/reproductions.md#<anchor> in the header"
    sections = _sections()
    for link in links:
        assert link in sections, f"{recipe.name} links to #{link}, which docs/reproductions.md lacks"
