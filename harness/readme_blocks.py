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


# --- claims a doc makes that the code can confirm (tests/unit/test_docs.py) --------------

DOCS = [README, REPO / "models" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
ROOT_FILES = r"deployments(?:\.[a-z]+)?\.yaml|Makefile|pyproject\.toml|constraints\.txt|DEVELOPERS\.md"
TOP_DIRS = r"serve_app|tests|load_tests|harness|deploy|models|docs"


def prose(path: Path) -> str:
    """A markdown file without its HTML comments (code blocks kept: their
    commands and paths are claims too)."""
    return re.sub(r"<!--.*?-->", "", path.read_text(), flags=re.S)


def spans(path: Path) -> list[str]:
    """The text of every inline `code` span outside fenced blocks."""
    text = re.sub(r"^```.*?^```$", "", prose(path), flags=re.M | re.S)
    return re.findall(r"`([^`\n]+)`", text)


def routes_named(path: Path) -> list[tuple[str, str]]:
    """(method or URL, path) for every `METHOD /path` and every URL on the
    service's address in a doc, query strings dropped."""
    text = prose(path)
    found = [(m, p) for m, p in re.findall(r"\b(GET|POST|PUT|PATCH|DELETE) +(/[^\s`'\",)\]]*)", text)]
    found += [("URL", p) for p in re.findall(re.escape(URL) + r"(/[^\s`'\",)\]>]*)", text)]
    return [(m, p.split("?")[0].rstrip(".:;")) for m, p in found]


def settings_named(path: Path, sections: set[str]) -> list[tuple[str, str]]:
    """(dotted setting, what follows it in parentheses, or "") for every
    `section.name...` code span whose first part is an `args:` section."""
    text = re.sub(r"^```.*?^```$", "", prose(path), flags=re.M | re.S)
    out = []
    for m in re.finditer(r"`([a-z_]+(?:\.[a-z_0-9]+)+)`( \(([^()]*)\))?", text):
        parts = m.group(1).split(".")
        if parts[0] in sections and parts[-1] not in ("py", "md", "yaml", "json", "txt", "sh", "toml"):
            out.append((m.group(1), m.group(3) or ""))
    return out


def paths_named(text: str) -> list[str]:
    """Repository paths in a text: under the top-level folders, and the
    root files (deployments*.yaml, Makefile, ...); templates and globs left out."""
    found = re.findall(rf"(?<![\w/.~-])((?:{TOP_DIRS})/[\w./*{{}}-]*[\w/*}}])", text)
    found += re.findall(rf"(?<![\w/.-])({ROOT_FILES})(?![\w.-])", text)
    return [p for p in found if not re.search(r"[{*]", p)]


def modules_named(text: str) -> list[str]:
    """Dotted `serve_app...` and `load_tests...` names (a module, maybe
    followed by `.Name` or `:Name` and one attribute)."""
    return re.findall(r"(?<![\w./-])((?:serve_app|load_tests|harness)(?:\.\w+)+(?::\w+(?:\.\w+)?)?)", text)


def make_targets_named(path: Path) -> list[str]:
    """`make TARGET` in code spans, and lines of code blocks that run make."""
    out = [m.group(1) for s in spans(path) for m in [re.match(r"make ([a-z][\w-]*)", s)] if m]
    for b in blocks(path):
        out += re.findall(r"^(?:\$ )?make ([a-z][\w-]*)", b.text, flags=re.M)
    return out


def load_tests_named(path: Path) -> list[str]:
    return re.findall(r"python -m load_tests ([a-z_]+)", prose(path))


def error_codes_named(path: Path) -> list[tuple[int, str]]:
    """(status, code) for every `NNN `code`` or table row `| NNN | `code` |`."""
    text = prose(path)
    pairs = re.findall(r"\b([1-5]\d\d) `([a-z_]+)`", text)
    pairs += re.findall(r"^\| *([1-5]\d\d) *\| *`([a-z_]+)`", text, flags=re.M)
    return [(int(s), c) for s, c in pairs]


def section(path: Path, heading: str) -> str:
    """The text under a `## heading` up to the next heading of that level."""
    m = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", prose(path), flags=re.M | re.S)
    return m.group(1) if m else ""
