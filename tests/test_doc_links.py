"""The documents' links resolve: every relative link of the README, docs/ and benchmarks/README.md names a
file that exists (and a heading of it, for ``#anchor``), and every section a document quotes (``FILE.md,
"Section"``) is a heading or a bold lead of that file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator, Tuple

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
#: ``FILE.md, "Section"`` or ``[...](FILE.md), "Section" and "Other"``
QUOTED = re.compile(r"([\w./-]+\.md)\)?,\s+((?:\"[^\"]+\"(?:,? and )?)+)")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but hyphens dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _links() -> Iterator[Tuple[Path, str]]:
    for doc in DOCUMENTS:
        for target in LINK.findall(doc.read_text()):
            if not re.match(r"^[a-z]+://|^mailto:", target):
                yield doc, target


def test_every_relative_link_names_a_file_and_heading_that_exist():
    bad = []
    for doc, target in _links():
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            bad.append(f"{doc.relative_to(ROOT)}: {target}")
        elif anchor and file.suffix == ".md":
            headings = [_slug(h) for h in re.findall(r"^#+ (.+)$", file.read_text(), re.M)]
            if anchor not in headings:
                bad.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not bad, bad


def test_every_quoted_section_is_in_the_file_it_names():
    bad = []
    for doc in DOCUMENTS:
        for name, quoted in QUOTED.findall(doc.read_text()):
            file = next((p for p in (doc.parent / name, ROOT / name) if p.is_file()), None)
            if file is None:
                bad.append(f"{doc.relative_to(ROOT)}: {name} does not exist")
                continue
            text = file.read_text()
            for section in re.findall(r"\"([^\"]+)\"", quoted):
                section = " ".join(section.split())  # a quote wrapped across lines
                lead = re.escape(section)
                if not re.search(rf"^#+ {lead}|\*\*{lead}", text, re.M):
                    bad.append(f"{doc.relative_to(ROOT)}: {name} has no section {section!r}")
    assert not bad, bad


def test_the_checks_find_what_is_missing(tmp_path):
    """The two rules on a document built here: a missing file, a missing heading, a missing section."""
    good = tmp_path / "good.md"
    good.write_text("# Title\n\n## Two GPUs\n\n**On 2 GPUs** (figures)\n")
    assert _slug("Two GPUs") == "two-gpus"
    text = '[a](good.md#two-gpus) [b](missing.md) (good.md, "On 2 GPUs") (good.md, "On 3 GPUs")'
    found = QUOTED.findall(text)
    assert [f[0] for f in found] == ["good.md", "good.md"]
    assert LINK.findall(text) == ["good.md#two-gpus", "missing.md"]


def test_the_polygraphy_table_names_every_debug_option():
    """docs/polygraphy.md lists every option of ``polygraphy debug``'s subtools (one of each option's spellings), with
    its key here or why there is none: read from the installed Polygraphy's own parsers, so a new option fails here."""
    import argparse
    import re

    from polygraphy.tools.debug.debug import Debug

    parser = argparse.ArgumentParser()
    Debug().setup_parser(parser.add_subparsers())
    debug = parser._subparsers._group_actions[0].choices["debug"]  # type: ignore[union-attr]
    doc = (ROOT / "docs" / "polygraphy.md").read_text()
    missing = []
    for tool, sub in debug._subparsers._group_actions[0].choices.items():
        for action in sub._actions:
            spellings = [o for o in action.option_strings if o.startswith("--") and o != "--help"]
            if spellings and not any(re.search(re.escape(o) + r"(?![a-z0-9-])", doc) for o in spellings):
                missing.append(f"{tool} {spellings[0]}")
    assert missing == []
