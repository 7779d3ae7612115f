"""The README's code blocks and the commands in them, for the tests that run
them (tests/unit/test_readme.py, tests/integration/test_serve_app.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
URL = "http://127.0.0.1:8000"  # the profiles' http_options (make serve's deployments.light.yaml), as the README's examples use it


@dataclass(frozen=True)
class Block:
    lang: str
    text: str


@dataclass(frozen=True)
class Command:
    """A `$ ...` line of a console block (continuation lines joined) and
    the output shown under it."""

    line: str
    shown: str


def blocks(path: Path = README) -> list[Block]:
    found = re.findall(r"^```(\w*)\n(.*?)^```$", path.read_text(), flags=re.M | re.S)
    return [Block(lang, text) for lang, text in found]


def commands(path: Path = README) -> list[Command]:
    out: list[Command] = []
    for b in blocks(path):
        if b.lang != "console":
            continue
        line, shown, cont = None, [], False
        for raw in b.text.splitlines():
            if cont:
                line += " " + raw.strip().rstrip("\\").strip()
                cont = raw.rstrip().endswith("\\")
            elif raw.startswith("$ "):
                if line is not None:
                    out.append(Command(line, "\n".join(shown)))
                line, shown = raw[2:].rstrip().rstrip("\\").strip(), []
                cont = raw.rstrip().endswith("\\")
            else:
                shown.append(raw)
        if line is not None:
            out.append(Command(line, "\n".join(shown)))
    return out


def texts(output: str) -> list[str]:
    """The `text` values in an answer as printed (also where the README
    abbreviates the rest of it with `...`)."""
    return re.findall(r'"text": ?"((?:[^"\\]|\\.)*)"', output)


def error_codes(output: str) -> list[str]:
    return re.findall(r'"code": ?"([a-z_]+)"', output)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```$", "", path.read_text(), flags=re.M | re.S)
    return {slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def links(path: Path) -> list[str]:
    """Relative link targets in a markdown file (outside code blocks and comments)."""
    text = re.sub(r"^```.*?^```$|<!--.*?-->", "", path.read_text(), flags=re.M | re.S)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", t)]
