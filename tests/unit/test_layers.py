"""serve_app's rooms (serve_app.LAYERS): every module's imports (read with
ast, lazy ones inside functions included) go only to its own room or a room
below; no cycle between rooms, nor between any two modules (of serve_app,
harness/ or load_tests/: an import inside a function counts); no module over 450 lines; at
most 12 modules at the top level; the HTTP front, its app and routes import
no Ray."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from serve_app import LAYERS

PACKAGE = Path(__file__).resolve().parents[2] / "serve_app"
MAX_LINES = 450
MAX_TOP_LEVEL = 12


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    out = {}
    for p in sorted(root.rglob("*.py")):
        parts = p.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The serve_app modules `name` imports (the longest known prefix of each)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def room_of(name: str) -> str:
    """Its room, or "top" (top-level modules, tools/, the package itself)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in LAYERS else ("top" if len(parts) > 1 else "package")


RANK = {room: i for i, room in enumerate(LAYERS)} | {"top": len(LAYERS), "package": -1}


def upward_imports(known: dict[str, Path]) -> list[str]:
    bad = []
    for name, path in known.items():
        for dep in imports_of(name, path, known):
            if dep == "serve_app":
                dep_room = "package"  # `from serve_app import LAYERS`: below everything
            else:
                dep_room = room_of(dep)
            if RANK[dep_room] > RANK[room_of(name)]:
                bad.append(f"{name} ({room_of(name)}) imports {dep} ({dep_room})")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle found by a depth-first walk (each as the path that closes it)."""
    found, state = [], {}

    def walk(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                walk(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            walk(node, [node])
    return found


def room_graph(known: dict[str, Path]) -> dict[str, set[str]]:
    """Which room imports which (the top-level modules each a room of their own)."""
    graph: dict[str, set[str]] = {}
    unit = lambda n: n if room_of(n) in ("top", "package") else "serve_app." + room_of(n)  # noqa: E731
    for name, path in known.items():
        for dep in imports_of(name, path, known):
            if unit(dep) != unit(name):
                graph.setdefault(unit(name), set()).add(unit(dep))
    return graph


def test_every_import_goes_to_its_own_room_or_below():
    assert upward_imports(modules()) == []


def test_no_cycle_between_rooms_or_top_level_modules():
    assert cycles(room_graph(modules())) == []


def module_graph() -> dict[str, set[str]]:
    """Which module imports which, over serve_app, harness/ and load_tests/
    (a package's __init__ stands for the package: `from serve_app import X`)."""
    known = {**modules(), **modules(PACKAGE.parent / "harness"), **modules(PACKAGE.parent / "load_tests")}
    return {name: imports_of(name, path, known) for name, path in known.items()}


def test_no_cycle_between_modules():
    assert cycles(module_graph()) == []


def test_no_module_over_450_lines_and_at_most_12_at_the_top_level():
    known = modules()
    long = {str(p.relative_to(PACKAGE.parent)): n for p in known.values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
    top = [p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert len(top) <= MAX_TOP_LEVEL, top
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()} >= set(LAYERS)


# -- the checks themselves fail where they should ------------------------------------------
def _tree(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        f = tmp_path / "serve_app" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return modules(tmp_path / "serve_app")


def test_an_upward_import_is_found_relative_absolute_or_lazy(tmp_path):
    known = _tree(tmp_path, {
        "__init__.py": "", "core/__init__.py": "", "core/errors.py": "", "http/__init__.py": "",
        "http/ingress.py": "from ..core.errors import X\n",  # downward: fine
        "core/results.py": "def f():\n    from serve_app.http import ingress\n",  # upward, lazy
        "ocr/__init__.py": "", "ocr/decode.py": "from ..flow.pipeline import y\n",  # upward, relative
        "flow/__init__.py": "", "flow/pipeline.py": "",
    })
    assert sorted(upward_imports(known)) == [
        "serve_app.core.results (core) imports serve_app.http.ingress (http)",
        "serve_app.ocr.decode (ocr) imports serve_app.flow.pipeline (flow)"]


def test_a_cycle_between_top_level_modules_is_found(tmp_path):
    known = _tree(tmp_path, {"__init__.py": "", "app.py": "from serve_app import engine\n",
                             "engine.py": "import serve_app.app\n"})
    assert cycles(room_graph(known)) == [["serve_app.app", "serve_app.engine", "serve_app.app"]]


@pytest.mark.parametrize("room", LAYERS)
def test_every_room_has_a_docstring(room):
    assert ast.get_docstring(ast.parse((PACKAGE / room / "__init__.py").read_text()))


# -- the HTTP front runs without Ray -------------------------------------------------------
# The front, the app built over it and its routes (serve_app/http/, all but the Serve
# deployment in ingress.py): no import of Ray, theirs or through the serve_app modules they import.
RAY_FREE = ("serve_app.http.front", "serve_app.http.app", "serve_app.http.routes")


def imports_ray(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        if any(n == "ray" or n.startswith("ray.") for n in names):
            return True
    return False


def ray_paths(roots: tuple[str, ...], known: dict[str, Path]) -> list[list[str]]:
    """For each module that imports Ray and is reached from `roots` (by name
    prefix) through serve_app imports: the chain that reaches it."""
    chains, seen = [], set()
    todo = [[name] for name in known if name.startswith(roots)]
    while todo:
        chain = todo.pop()
        name = chain[-1]
        if name in seen:
            continue
        seen.add(name)
        if imports_ray(known[name]):
            chains.append(chain)
        todo.extend(chain + [dep] for dep in sorted(imports_of(name, known[name], known)))
    return chains


def test_the_front_its_app_and_routes_import_no_ray():
    known = modules()
    assert {"serve_app.http.front", "serve_app.http.app", "serve_app.http.routes.v1"} <= set(known)
    assert ray_paths(RAY_FREE, known) == []
    assert ray_paths(("serve_app.http.ingress",), known)  # the shell does: the check sees it


def test_a_ray_import_reached_through_another_module_is_found(tmp_path):
    known = _tree(tmp_path, {
        "__init__.py": "", "http/__init__.py": "", "http/front.py": "from serve_app.serving import metrics\n",
        "serving/__init__.py": "", "serving/metrics.py": "def f():\n    from ray.serve.metrics import Counter\n",
    })
    assert ray_paths(("serve_app.http.front",), known) == [["serve_app.http.front", "serve_app.serving.metrics"]]
