"""`python -m load_tests`: the benchmark programs and what each measures.

    python -m load_tests                      # the list
    python -m load_tests NAME --help          # a program's modes
    python -m load_tests NAME MODE [ARGS...]  # run one mode (MODE --help for its options)
    python -m load_tests NAME --smoke         # every mode of NAME at a tiny scale (the tests run this)

How a program is built: load_tests/cli.py; what they share: load_tests/__init__.py."""

from __future__ import annotations

import argparse
import importlib
import sys

from load_tests import cli

# name -> (what it answers, {mode: module}); a program with one mode runs it with or without naming it.
PROGRAMS: dict[str, tuple[str, dict[str, str]]] = {
    "serve": ("the service over HTTP against its baselines (in-process engine, simple server), one run", {
        "load": "load_tests.bench",
        "throughput-mode": "load_tests.throughput_mode",
    }),
    "engine": ("the in-process engine: against RapidOCR, the model sets against each other (reads and speed), "
               "its lower precisions against fp32", {
        "systems": "load_tests.bench_engine",
        "precision": "load_tests.precision_agreement",
        "tiers": "load_tests.tiers",
        "tiers-breakdown": "load_tests.tiers_breakdown",
    }),
    "memory": ("memory: a profile's footprint (PSS per process), its start, one client and 8 clients", {
        "footprint": "load_tests.footprint",
    }),
    "startup": ("start-up: `serve run` to ready phase by phase; a replica added by autoscaling (--scale-up)", {
        "serve-run": "load_tests.serve_phases",
    }),
    "documents": ("documents: reading order and layout, PDFs end to end, tables and regions", {
        "layout": "load_tests.bench_layout",
        "pdf": "load_tests.bench_pdf",
        "structure": "load_tests.bench_structure",
    }),
    "hostile": ("hostile traffic: the front (health, a normal request, memory) beside heavy work", {
        "front": "load_tests.front_stall",
        "callbacks": "load_tests.hostile_callbacks",
    }),
    "jobs": ("the job books: Redis against SQLite per submit and poll", {"backends": "load_tests.bench_job_backends"}),
    "soak": ("the service under open-loop load for a long time: errors and memory growth",
             {"soak": "load_tests.soak"}),
    "gpu": ("the GPU path (never run on this machine): preflight checks and the smoke run's steps", {
        "preflight": "load_tests.gpu_preflight",
        "smoke": "load_tests.gpu_smoke",
    }),
}


def add_cli_args(parser: argparse.ArgumentParser, name: str) -> None:
    summary, modes = PROGRAMS[name]
    parser.description = summary
    parser.add_argument("--smoke", action="store_true", help="every mode at a tiny scale (seconds), then exit")
    if len(modes) == 1:
        cli.parser_for(importlib.import_module(next(iter(modes.values()))), parser)
        return
    sub = parser.add_subparsers(dest="mode", metavar="MODE")
    for mode, module_name in modes.items():
        module = importlib.import_module(module_name)
        p = sub.add_parser(mode, help=cli.summary(module)[:120], description=module.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        cli.parser_for(module, p)


def main(name: str, argv: list[str]) -> int:
    _, modes = PROGRAMS[name]
    parser = argparse.ArgumentParser(prog=f"python -m load_tests {name}",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cli_args(parser, name)
    if argv in (["--smoke"], ["--smoke", "--"]):  # every mode's smoke, each with its defaults
        rc = 0
        for mode, module_name in modes.items():
            margv = ["--smoke"] if len(modes) == 1 else [mode, "--smoke"]
            args = parser.parse_args(margv)
            args.argv = margv
            print(f"== {name} {mode} --smoke", flush=True)
            rc |= cli.run(importlib.import_module(module_name), args)
        return rc
    if len(modes) == 1 and argv[:1] == list(modes):  # a one-mode program's mode may be named: `memory footprint`
        argv = argv[1:]
    args = parser.parse_args(argv)
    mode = next(iter(modes)) if len(modes) == 1 else args.mode
    if mode is None:
        parser.print_help()
        return 2
    args.argv = argv[1:] if len(modes) > 1 else argv
    return cli.run(importlib.import_module(modes[mode]), args)


def listing() -> str:
    width = max(map(len, PROGRAMS))
    lines = ["usage: python -m load_tests NAME [MODE] [ARGS...]   (NAME --help for its modes)", ""]
    for name, (summary, modes) in PROGRAMS.items():
        lines.append(f"  {name:<{width}}  {summary}")
        if len(modes) > 1:
            lines.append(f"  {'':<{width}}    modes: {', '.join(modes)}")
    return "\n".join(lines)


def entry(argv: list[str]) -> int:
    if argv[:1] == ["--names"]:  # one a line: what the smoke test runs
        print("\n".join(PROGRAMS))
        return 0
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(listing())
        return 0
    if argv[0] not in PROGRAMS:
        print(f"no load_tests program {argv[0]!r}; `python -m load_tests` lists them", file=sys.stderr)
        return 2
    return main(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(entry(sys.argv[1:]))
