"""`python -m load_tests`: one entry point that lists the benchmarks and
runs any of them (as `python load_tests/NAME.py` does)."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "load_tests", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_it_lists_every_program_with_what_it_measures_and_runs_one():
    listing = run()
    assert listing.returncode == 0, listing.stderr
    names = {line.split()[0] for line in listing.stdout.splitlines()[2:] if line.strip()}
    scripts = {p.stem for p in (REPO / "load_tests").glob("[!_]*.py") if 'if __name__ == "__main__":' in p.read_text()}
    assert names == scripts and {"bench", "soak", "hops", "bench_admission"} <= names
    assert "bench_engine" in listing.stdout and "RapidOCR" in listing.stdout  # its docstring's first sentence
    help_ = run("hop_budget", "--help")  # pure arithmetic: no Ray, no models
    assert help_.returncode == 0 and "--service" in help_.stdout
    unknown = run("nope")
    assert unknown.returncode == 2 and "no load_tests program 'nope'" in unknown.stderr
