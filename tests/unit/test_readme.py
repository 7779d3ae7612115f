"""The README is a newcomer's page: short, its two commands first, every
link and file it names present, its Python examples valid. That its curl,
handle and command-line examples answer what it shows is checked against a
real service in tests/integration/test_serve_app.py (test_readme_examples_*)."""

from __future__ import annotations

import re
import shlex

import pytest
import yaml

from harness.readme_blocks import README, REPO, URL, anchors, blocks, commands, error_codes, links, prose, texts

DOCS = sorted((REPO / "docs").glob("*.md"))


def test_the_readme_is_at_most_250_lines():
    assert len(README.read_text().splitlines()) <= 250


def test_make_serve_and_make_test_are_the_first_two_commands():
    first = blocks()[0]
    assert first.lang == "bash"
    assert [line.split("#")[0].strip() for line in first.text.splitlines()] == ["make serve", "make test"]
    makefile = (REPO / "Makefile").read_text()
    serve = re.search(r"^serve: .*\n((?:\t.*\n)+)", makefile, flags=re.M)
    assert serve and "serve run deployments.light.yaml" in serve.group(1)
    test = re.search(r"^test: (.*)\n((?:\t.*\n)+)", makefile, flags=re.M)
    assert test and 'pytest -q --durations=15 -m "not slow and not unit" tests' in test.group(2)
    assert "test-quick" in test.group(1)


@pytest.mark.parametrize("doc", [README] + DOCS, ids=lambda p: p.name)
def test_relative_links_lead_to_files_and_headings_that_exist(doc):
    broken = []
    for target in links(doc):
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert not broken, f"{doc.name}: links to nothing: {broken}"


def test_the_readme_links_every_doc_and_keeps_a_documentation_list():
    text = prose(README)
    assert "\n## Documentation\n" in text
    listed = set(re.findall(r"\]\(docs/([\w.-]+\.md)\)", text.split("\n## Documentation\n", 1)[1]))
    assert listed == {p.name for p in DOCS}


def test_python_examples_compile():
    code = [b.text for b in blocks() if b.lang == "python"]
    assert len(code) >= 2  # the handle and the library
    for text in code:
        compile(text, "README.md", "exec")


def test_every_example_names_files_that_exist_and_the_service_the_config_serves():
    for profile in ("deployments.light.yaml", "deployments.yaml"):  # `make serve`'s, and the per-stage one
        http = yaml.safe_load((REPO / profile).read_text())["http_options"]
        assert URL == f"http://{http['host']}:{http['port']}", profile
    cmds = commands()
    curls = [c for c in cmds if c.line.startswith("curl ")]
    clis = [c for c in cmds if " -m serve_app " in c.line]
    assert curls and clis
    for c in curls:
        assert URL in c.line
        for name in re.findall(r"@([\w./-]+)", c.line):
            assert (REPO / name).is_file(), name
        assert texts(c.shown), f"{c.line}: shows no text read"
    for c in clis:
        args = shlex.split(c.line)[3:]
        lines = c.shown.splitlines()
        assert len(lines) == len(args)
        for arg, shown in zip(args, lines):
            assert f'"image": "{arg}"' in shown
            # The README shows a missing file's error: it must stay missing; every other image exists.
            assert (REPO / arg).is_file() == (error_codes(shown) == []), arg
