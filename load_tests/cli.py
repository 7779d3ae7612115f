"""The one way a load_tests program is built and run: a mode module has
`add_cli_args(parser)` and `main(args)` (and may have `smoke(args)`); a
program is one mode module or a few under one name (load_tests/__main__.py
holds the registry). `standalone` runs a mode module as
`python -m load_tests.MODULE`: only for the benchmarks' own child processes
(footprint's engine, throughput-mode's, the simple server, the GPU steps)."""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType
from typing import Optional


def summary(module: ModuleType) -> str:
    """The first paragraph of a module's docstring, on one line."""
    return " ".join((module.__doc__ or "").split("\n\n")[0].split())


def parser_for(module: ModuleType, parser: Optional[argparse.ArgumentParser] = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(description=module.__doc__,
                                               formatter_class=argparse.RawDescriptionHelpFormatter)
    module.add_cli_args(parser)
    if not any("--smoke" in a.option_strings for a in parser._actions):
        parser.add_argument("--smoke", action="store_true",
                            help="a tiny run that proves the program still runs (seconds; measures nothing)")
    return parser


def run(module: ModuleType, args: argparse.Namespace) -> int:
    """The mode's `smoke(args)` under --smoke where it has one, else its `main(args)`."""
    if getattr(args, "smoke", False) and hasattr(module, "smoke"):
        rc = module.smoke(args)
    elif getattr(args, "smoke", False):
        print(f"{module.__name__}: smoke: imported and parsed (no tiny run of its own)")
        rc = 0
    else:
        rc = module.main(args)
    return int(rc or 0)


def standalone(name: str, argv: Optional[list[str]] = None) -> int:
    module = importlib.import_module(name)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser_for(module).parse_args(argv)
    args.argv = argv
    return run(module, args)


def check(ok: bool, what: str) -> None:
    """A smoke's check: a failed one ends the program with exit 1 naming what broke."""
    if not ok:
        raise SystemExit(f"smoke check failed: {what}")
