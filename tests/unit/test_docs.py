"""What the docs state that the code can confirm, checked against the code:
each test reads the claims of every doc (README.md, models/README.md,
docs/*.md) and looks them up in the code, so a renamed route, setting,
module, metric or file fails here until the doc says what the code does.

- every route a doc names is served (the routes declared in serve_app);
- every `section.setting` a doc names exists in the `args:` models, and a
  value stated right after it, `(N unit)`, is its default;
- every repository path, `serve_app.module[:Name]`, `tests/x.py::test`,
  `make TARGET` and `python -m load_tests NAME` a doc names exists;
- the metrics listed in docs/operations.md are the metrics the code makes;
- every `NNN `code`` error pair is an error the code raises with that
  status, and the error table lists every error class;
- every docs/NAME.md that code, configs or docs name exists, with the
  heading a `docs/NAME.md, "Heading"` reference quotes."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from harness.readme_blocks import (DOCS, REPO, anchors, error_codes_named, load_tests_named, make_targets_named,
                                   modules_named, paths_named, prose, routes_named, section, settings_named, slug)
from serve_app.core.app_args import AppArgs

IDS = [str(p.relative_to(REPO)) for p in DOCS]
FASTAPI_ROUTES = ("/docs", "/openapi.json", "/redoc")  # FastAPI's own
SERVE_PROXY_ROUTES = ("/-/healthz", "/-/routes")  # Ray Serve's HTTP proxy answers these itself


def sources(*tops: str) -> list[Path]:
    return sorted(p for top in tops for p in (REPO / top).rglob("*.py"))


@lru_cache(maxsize=None)
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


@lru_cache(maxsize=1)
def served_routes() -> tuple[str, ...]:
    """Every path a route decorator in serve_app declares
    (`@x.get("/path")`, `.post`, `.api_route`, ...), and FastAPI's own."""
    out = [*FASTAPI_ROUTES, *SERVE_PROXY_ROUTES]
    for path in sources("serve_app"):
        for node in ast.walk(tree(path)):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("get", "post", "put", "patch", "delete", "api_route", "add_api_route")
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                    and node.args[0].value.startswith("/")):
                out.append(node.args[0].value)
    return tuple(out)


def route_served(path: str) -> bool:
    path = re.sub(r"\{[^}]*\}", "X", path)
    return any(re.fullmatch(re.sub(r"\\\{[^}]*\\\}", "[^/]+", re.escape(r)), path) for r in served_routes())


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_every_route_a_doc_names_is_served(doc):
    named = routes_named(doc)
    missing = sorted({p for _, p in named if not route_served(p)})
    assert not missing, f"{doc.name} names routes the service does not have: {missing}"


def test_the_route_check_reads_the_code():
    assert route_served("/v1/ocr") and route_served("/v1/ocr/jobs/5f0c") and route_served("/docs")
    assert not route_served("/v1/ocr/nothing") and not route_served("/v2/ocr")


# --- settings -----------------------------------------------------------------------------------------

UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "M": 10**6, "k": 10**3, "h": 3600, "min": 60, "ms": 0.001}


def model_in(annotation) -> type | None:
    """The pydantic model an annotation holds (`Optional[Model]` too)."""
    if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
        return annotation
    return next((m for a in getattr(annotation, "__args__", ()) if (m := model_in(a))), None)


def default_of(dotted: str):
    """The default the app runs with for a dotted setting (`AppArgs()`'s
    value; None under an unset optional section), or KeyError naming the
    part that does not exist."""
    model, value = AppArgs, AppArgs()
    for part in dotted.split("."):
        fields = getattr(model, "model_fields", None) if model else None
        if fields is None or part not in fields:
            raise KeyError(f"{dotted}: no setting {part!r} there")
        model = model_in(fields[part].annotation)
        value = getattr(value, part, None) if value is not None else None
    return value


def stated(text: str):
    """The value a doc states in `(N unit, ...)`, or None when it states none."""
    m = re.match(r"(true|false|null)\b|(-?[\d,]*\.?\d+) ?(KiB|MiB|GiB|M|k|h|min|ms|s)?\b", text)
    if not m:
        return None
    if m.group(1):
        return {"true": True, "false": False, "null": None}[m.group(1)], None
    return float(m.group(2).replace(",", "")), m.group(3)


def agrees(default, said) -> bool:
    value, unit = said
    if isinstance(default, bool) or value is None or isinstance(value, bool):
        return default == value
    if not isinstance(default, (int, float)):
        return not isinstance(default, str) and default is not None  # a list or a section: "(N rungs ...)" is prose
    return any(abs(default - v) <= 1e-9 * max(1.0, abs(v)) for v in (value, value * UNITS.get(unit or "", 1)))


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_every_setting_a_doc_names_exists_with_the_default_it_states(doc):
    sections = set(AppArgs.model_fields)
    wrong = []
    for dotted, after in settings_named(doc, sections):
        try:
            default = default_of(dotted)
        except KeyError as e:
            wrong.append(str(e))
            continue
        said = stated(after)
        if said is not None and not agrees(default, said):
            wrong.append(f"{dotted}: the doc says ({after}), the default is {default!r}")
    assert not wrong, f"{doc.name}: " + "; ".join(wrong)


def test_the_setting_check_reads_the_models():
    assert agrees(default_of("engine.limits.max_bytes"), stated("20 MiB"))
    assert agrees(default_of("ingress.max_in_flight"), stated("32 concurrent requests"))
    assert not agrees(default_of("ingress.max_in_flight"), stated("16"))
    with pytest.raises(KeyError):
        default_of("ingress.pipeline_in_ingress")


# --- paths, modules, programs, make targets -------------------------------------------------------------


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_every_path_a_doc_names_exists(doc):
    text = prose(doc)
    missing = sorted({p for p in paths_named(text) if not (REPO / p.rstrip("/")).exists() and not ignored(p)})
    assert not missing, f"{doc.name} names files that do not exist: {missing}"
    tests = re.findall(r"(tests/[\w/]+\.py)::(\w+)(\*?)", text)
    gone = [f"{f}::{t}{star}" for f, t, star in tests
            if (REPO / f).exists() and not re.search(rf"def {t}{'' if star else chr(92) + 'b'}", (REPO / f).read_text())]
    assert not gone, f"{doc.name} names tests that do not exist: {gone}"


def ignored(path: str) -> bool:
    """A path git ignores (a program's output folder, such as load_tests/out/)."""
    import subprocess

    return subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO).returncode == 0


def defined(module: Path, name: str, attr: str | None) -> bool:
    for node in tree(module).body:
        names = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names = [node.target.id]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [(a.asname or a.name).split(".")[0] for a in node.names]
        if name in names:
            if attr is None or not isinstance(node, ast.ClassDef):
                return True
            return any(getattr(n, "name", None) == attr or (isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == attr)
                       or (isinstance(n, ast.Assign) and any(getattr(t, "id", "") == attr for t in n.targets))
                       for n in ast.walk(node))
    return False


def resolves(dotted: str) -> bool:
    """A dotted module path (maybe `:Name` or `.Name`, and `.attr` of a
    class) names a module file or package of this repository and, after
    it, something that module defines."""
    head, _, tail = dotted.partition(":")
    parts = head.split(".")
    for cut in range(len(parts), 0, -1):
        base = REPO.joinpath(*parts[:cut])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if module.is_file() or base.is_dir():
            rest = parts[cut:] + (tail.split(".") if tail else [])
            if not rest:
                return True
            return module.is_file() and len(rest) <= 2 and defined(module, rest[0], rest[1] if len(rest) > 1 else None)
    return False


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_every_module_and_name_a_doc_names_exists(doc):
    missing = sorted({m for m in modules_named(prose(doc)) if not resolves(m)})
    assert not missing, f"{doc.name} names modules or names the code does not have: {missing}"


def test_the_module_check_reads_the_code():
    assert resolves("serve_app.engine.OcrEngine") and resolves("serve_app.app:build_app")
    assert resolves("serve_app.serving.autoscaling:BacklogPolicy") and resolves("serve_app.tools.config_doc")
    assert not resolves("serve_app.engine.NoSuchThing") and not resolves("serve_app.nothing")


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*):", (REPO / "Makefile").read_text(), flags=re.M))


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_every_make_target_and_load_test_a_doc_names_exists(doc):
    programs = subprocess.run([sys.executable, "-m", "load_tests", "--names"], cwd=REPO, capture_output=True,
                              text=True, check=True).stdout.split()
    missing = sorted(set(make_targets_named(doc)) - make_targets())
    assert not missing, f"{doc.name} names make targets the Makefile does not have: {missing}"
    unknown = sorted(set(load_tests_named(doc)) - set(programs))
    assert not unknown, f"{doc.name} names `python -m load_tests` programs that do not exist: {unknown}"


# --- metrics and errors ---------------------------------------------------------------------------------------


def metrics_made() -> set[str]:
    out = set()
    for path in sources("serve_app"):
        for node in ast.walk(tree(path)):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None))
                    in ("Counter", "Gauge", "Histogram") and node.args and isinstance(node.args[0], ast.Constant)):
                out.add(node.args[0].value)
    return out


def test_the_metrics_listed_are_the_metrics_the_code_makes():
    listed = set(re.findall(r"`(ocr_[a-z_]+)`", section(REPO / "docs" / "operations.md", "Metrics")))
    made = metrics_made()
    assert len(made) >= 20
    assert listed == made, f"listed, not made: {sorted(listed - made)}; made, not listed: {sorted(made - listed)}"


def error_classes() -> dict[str, int]:
    """code -> HTTP status of every error class in serve_app/core/errors.py (status inherited)."""
    status: dict[str, int] = {}
    codes: dict[str, int] = {}
    for node in tree(REPO / "serve_app" / "core" / "errors.py").body:
        if not isinstance(node, ast.ClassDef):
            continue
        own = {t.id: n.value.value for n in node.body if isinstance(n, ast.Assign)
               for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant)}
        inherited = next((status[b.id] for b in node.bases if isinstance(b, ast.Name) and b.id in status), None)
        status[node.name] = own.get("status", inherited)
        if "code" in own:
            codes[own["code"]] = status[node.name]
    return codes


def raised_elsewhere(code: str) -> bool:
    return any(f'"{code}"' in p.read_text() for p in sources("serve_app"))


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_every_error_a_doc_names_has_that_status(doc):
    classes = error_classes()
    wrong = [f"{s} {c}" for s, c in error_codes_named(doc)
             if (classes[c] != s if c in classes else not raised_elsewhere(c))]
    assert not wrong, f"{doc.name}: errors the code does not answer so: {wrong}"


def test_the_error_table_lists_every_error():
    table = {c for _, c in error_codes_named(REPO / "docs" / "api.md")}
    assert set(error_classes()) - {"config_error"} <= table, sorted(set(error_classes()) - table)


# --- links to docs from code, configs and docs ---------------------------------------------------------------


def repo_texts() -> list[Path]:
    skip = {".venv", ".git", "node_modules"}
    out = []
    for p in REPO.rglob("*"):
        parts = p.relative_to(REPO).parts
        # .venv-build and .venv-export (make models) are environments too.
        if p.is_file() and not skip & set(parts) and not any(q.startswith(".venv") for q in parts) and (
                p.suffix in (".py", ".yaml", ".yml", ".md", ".sh", ".toml", ".txt", ".cfg") or p.name == "Makefile"):
            out.append(p)
    return out


def test_every_doc_the_repository_names_exists_with_the_heading_it_quotes():
    wrong = []
    for path in repo_texts():
        if path.name == "test_rehome.py":  # rewrites made-up doc paths as its data
            continue
        text = path.read_text(errors="replace")
        for name, heading in re.findall(r"docs/([a-z][\w.-]*\.md)(?:,? \"([^\"]+)\")?", text):
            doc = REPO / "docs" / name
            if not doc.exists():
                wrong.append(f"{path.relative_to(REPO)}: docs/{name}")
            elif heading and not any(slug(" ".join(heading.split())) in a for a in anchors(doc)):
                wrong.append(f"{path.relative_to(REPO)}: docs/{name}, \"{heading}\"")
    assert not wrong, wrong


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_every_environment_variable_a_doc_names_is_read_somewhere(doc):
    names = set(re.findall(r"\b(OCR_[A-Z0-9_]+)\b", prose(doc)))
    code = "\n".join(p.read_text(errors="replace") for p in repo_texts() if "docs" not in p.relative_to(REPO).parts[:1]
                     and p.name != "README.md")
    missing = sorted(n for n in names if n not in code)
    assert not missing, f"{doc.name} names environment variables nothing reads: {missing}"


def test_the_profile_table_names_every_serve_config_and_the_address_it_listens_on():
    import yaml

    rows = dict(re.findall(r"^\| `(deployments[\w.]*\.yaml)` \|.*\| *([\d.]+:\d+) *\|$",
                           prose(REPO / "docs" / "configuration.md"), flags=re.M))
    profiles = sorted(p.name for p in REPO.glob("deployments*.yaml"))
    assert sorted(rows) == profiles
    for name, address in rows.items():
        http = yaml.safe_load((REPO / name).read_text())["http_options"]
        assert address == f"{http['host']}:{http['port']}", name
    readme = prose(REPO / "README.md")
    assert all(f"`{name}`" in readme for name in profiles)


def test_the_options_table_lists_every_request_option_with_its_range():
    from dataclasses import fields

    from serve_app.core.request_options import RANGES, OcrOptions, describe_range

    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \|", section(REPO / "docs" / "api.md", "`POST /v1/ocr`"), flags=re.M))
    assert set(rows) == {f.name for f in fields(OcrOptions)}
    for name in RANGES:
        assert rows[name].strip() == describe_range(name), name


def test_every_cli_flag_the_api_doc_names_is_an_argument_of_the_cli():
    declared = {node.args[0].value for path in sources("serve_app") for node in ast.walk(tree(path))
                if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument"
                and node.args and isinstance(node.args[0], ast.Constant)}
    named = set(re.findall(r"`(--[a-z][\w-]*)", section(REPO / "docs" / "api.md", "Library and command line")))
    assert named and named - {"--help"} <= declared, sorted(named - declared)  # argparse adds --help


def test_the_harness_table_names_every_harness_module():
    named = set(re.findall(r"`harness\.(\w+)`", section(REPO / "docs" / "testing.md", "The harness")))
    modules = {p.stem for p in (REPO / "harness").glob("*.py") if p.stem != "__init__"}
    assert named == modules, f"not in the table: {sorted(modules - named)}; no such module: {sorted(named - modules)}"


def test_the_x_cache_table_lists_every_way_the_result_cache_answers():
    counted = {k.value for node in ast.walk(tree(REPO / "serve_app" / "http" / "policies" / "result_cache.py"))
               if isinstance(node, ast.Assign) and any(getattr(t, "attr", None) == "counts" for t in node.targets)
               and isinstance(node.value, ast.Dict) for k in node.value.keys}
    listed = set(re.findall(r"^\| `(\w+)` \|", section(REPO / "docs" / "operations.md", "The result cache"), flags=re.M))
    assert counted and listed == counted, (listed, counted)
