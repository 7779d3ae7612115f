"""`python -m load_tests`: the benchmarks and tools of load_tests/ with what
each measures; `python -m load_tests NAME [ARGS...]` runs one of them, as
`python load_tests/NAME.py ARGS...` does (`--help` for its options)."""

from __future__ import annotations

import ast
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def programs() -> dict[str, str]:
    """name -> first line of its docstring, for every module here that runs
    as a program (it has an `if __name__ == "__main__":` block)."""
    out = {}
    for path in sorted(HERE.glob("*.py")):
        if path.name.startswith("_"):
            continue
        source = path.read_text()
        if 'if __name__ == "__main__":' not in source:
            continue
        doc = ast.get_docstring(ast.parse(source)) or ""
        out[path.stem] = " ".join(doc.split("\n\n")[0].split())
    return out


def main(argv: list[str]) -> int:
    found = programs()
    if not argv or argv[0] in ("-h", "--help", "list"):
        width = max(map(len, found))
        print("usage: python -m load_tests NAME [ARGS...]   (NAME --help for its options)\n")
        for name, summary in found.items():
            print(f"  {name:<{width}}  {summary[:110] + ('...' if len(summary) > 110 else '')}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in found:
        print(f"no load_tests program {name!r}; `python -m load_tests` lists them", file=sys.stderr)
        return 2
    sys.argv = [str(HERE / f"{name}.py"), *rest]
    runpy.run_module(f"load_tests.{name}", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
