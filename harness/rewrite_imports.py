"""Rewrite a test or load-test file written before harness/ existed:

    python -m harness.rewrite_imports FILE [FILE ...]

- `from peer import ...` (and pdfs, pages, redis_server, xml_checks,
  readme_blocks: the helpers that lived in tests/) -> `from harness.peer import ...`;
- `from serve_fixtures import ...` and `load_tests.service` -> `harness.service`;
  `from load_tests import service` -> `from harness import service`;
- the `sys.path` preludes (`sys.path.insert(...)`, `sys.path[:0] = [...]`,
  with their `if __package__ ...:` / `if str(REPO) not in sys.path:` guards)
  are dropped: pytest puts the repository root on the path (pyproject's
  `pythonpath`), and load_tests' programs run as `python -m load_tests NAME`.

- prose: `tests/peer.py` -> `harness/peer.py` (...), `load_tests/service.py`
  -> `harness/service.py`, `python load_tests/NAME.py` -> `python -m load_tests NAME`.

A program a test or a program starts by its path (`[sys.executable,
__file__, ...]`, `REPO / "load_tests/NAME.py"`) must be changed by hand to
`[sys.executable, "-m", "load_tests.NAME", ...]` with `cwd` the repository
root. Works on .py and .md files; prints the files it changed."""

from __future__ import annotations

import re
import sys
from pathlib import Path

HELPERS = ("peer", "pdfs", "pages", "redis_server", "xml_checks", "readme_blocks")
RULES = [
    (re.compile(rf"^(\s*)from ({'|'.join(HELPERS)}) import", re.M), r"\1from harness.\2 import"),
    (re.compile(r"^(\s*)from serve_fixtures import", re.M), r"\1from harness.service import"),
    (re.compile(r"load_tests\.service\b"), "harness.service"),
    (re.compile(r"^(\s*)from load_tests import service\b", re.M), r"\1from harness import service"),
    (re.compile(r"^(\s*)from load_tests import (\w+), service\b(.*)$", re.M),
     r"\1from harness import service\3\n\1from load_tests import \2\3"),
    # where the helpers are named in prose (docstrings, comments, docs/*.md)
    (re.compile(rf"\btests/({'|'.join(HELPERS)})\.py\b"), r"harness/\1.py"),
    (re.compile(r"\bload_tests/service\.py\b"), "harness/service.py"),
    (re.compile(r"\b(python3?) load_tests/(\w+)\.py\b"), r"\1 -m load_tests \2"),
]
GUARD = re.compile(r'^\s*if (__package__ in \(None, ""\)|str\(\w+\) not in sys\.path):')
EDIT = re.compile(r"^\s*sys\.path(\.insert\(|\[:0\] = )")


def rewrite(text: str) -> str:
    for pattern, repl in RULES:
        text = pattern.sub(repl, text)
    lines = text.splitlines(keepends=True)
    out, i = [], 0
    while i < len(lines):
        if GUARD.match(lines[i]) and i + 1 < len(lines) and EDIT.match(lines[i + 1]):
            i += 2
            continue
        if EDIT.match(lines[i]):
            i += 1
            continue
        out.append(lines[i])
        i += 1
    return "".join(out)


def main(argv: list[str]) -> int:
    for name in argv:
        path = Path(name)
        text = path.read_text()
        new = rewrite(text)
        if new != text:
            path.write_text(new)
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
