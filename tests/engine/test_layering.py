"""The layering of the project's packages, read from the source (ast; nothing is imported):

- `engine` never imports Qt (PySide6, shiboken6, vispy, pyqtgraph), `ui` or `app`;
- `engine/models` imports no engine package. An *engine package* is every subpackage of engine/
  except `models` itself and `kv` (shared infrastructure the models use: page tables, attention
  backends) -- today engine.lingbot, engine.vggt, engine.geometric, engine.parallel, engine.io,
  engine.align -- and every top-level engine module that imports one of them (engine.model_zoo,
  engine.windowed, engine.scheduler, ...). Top-level modules that import none (engine.api, the
  engine's contract: errors and settings; engine.host_copy) stay usable from the models;
- `ui` does not import `app` (app -> ui -> engine);
- nothing shipped (app, engine, ui) imports `benchmarks` or `tests`;
- no import cycles among the modules of app, engine and ui.

Every import statement counts, at module level or inside a function: a function-level import
only defers a dependency, it does not remove it, and a cycle through one still means neither
module can be understood (or tested) without the other. `importlib.import_module(name)` calls are
not followed: the engine registry (engine/api.py) and the CLI's subcommand table (app/cli.py) load
their plug-ins by name, from the top down. `from pkg import name` counts as importing
`pkg.name` when that is a module, else `pkg` itself; a module's parent packages, which Python
imports first, are not counted as its dependencies.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOP = ("app", "engine", "ui")
QT = ("PySide6", "shiboken6", "vispy", "pyqtgraph")

def project_modules(root: Path, top=TOP) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's __init__) for every .py under the top packages."""
    mods = {}
    for pkg in top:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            mods[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return mods


def imports_of(name: str, path: Path, is_pkg: bool, modules) -> list[tuple[str, int]]:
    """(imported name, line) of every import statement of a module, at any depth. Names inside
    the project resolve to the module imported; others keep their dotted name."""
    package = name if is_pkg else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(_resolve(a.name, modules), node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for a in node.names:
                sub = f"{source}.{a.name}"
                out.append((sub if sub in modules else _resolve(source, modules), node.lineno))
    return out


def _resolve(dotted: str, modules) -> str:
    """The project module a dotted name belongs to (its longest prefix that is one), else itself."""
    name = dotted
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or dotted


def import_graph(root: Path, top=TOP):
    modules = project_modules(root, top)
    edges = {m: imports_of(m, p, pkg, modules) for m, (p, pkg) in modules.items()}
    return modules, edges


def cycles(modules, edges) -> list[set]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    graph = {m: sorted({t for t, _ in edges[m] if t in modules and t != m}) for m in modules}
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(comp)
    return found


def _inside(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def violations(edges, module_prefixes, forbidden) -> list[str]:
    return [f"{m}:{line} imports {t}" for m, imps in sorted(edges.items()) if _inside(m, module_prefixes)
            for t, line in imps if _inside(t, forbidden)]


def engine_packages(modules, edges) -> list[str]:
    """engine's subpackages other than models and kv, plus the top-level engine modules importing one."""
    in_engine = [m.split(".") for m in modules if m.startswith("engine.")]
    subpackages = {p[1] for p in in_engine if len(p) > 2} | {
        p[1] for p in in_engine if len(p) == 2 and modules[".".join(p)][1]}
    packages = [f"engine.{s}" for s in sorted(subpackages) if s not in ("models", "kv")]
    above = [m for m, (_, pkg) in modules.items() if m.startswith("engine.") and m.count(".") == 1 and not pkg
             and any(_inside(t, packages) for t, _ in edges[m])]
    return packages + sorted(above)


# --- the checker itself, on a small tree -------------------------------------------------------

def test_the_checker_sees_function_level_cycles_relative_imports_and_forbidden_imports(tmp_path):
    files = {
        "engine/__init__.py": "",
        "engine/api.py": "import numpy\n",
        "engine/models/__init__.py": "",
        "engine/models/trunk.py": "from ..api import x\n\ndef f():\n    from ..lingbot import model\n",
        "engine/lingbot/__init__.py": "",
        "engine/lingbot/model.py": "from engine.models import trunk\n",
        "engine/zoo.py": "def g():\n    from .lingbot.model import M\n",
        "engine/a.py": "def f():\n    from . import b\n",
        "engine/b.py": "from engine.a import f\n",
        "ui/__init__.py": "",
        "ui/view.py": "import PySide6.QtWidgets\n\ndef s():\n    import app.settings\n",
        "app/__init__.py": "",
        "app/settings.py": "from ui import view\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    modules, edges = import_graph(tmp_path)
    found = sorted(sorted(c) for c in cycles(modules, edges))
    assert found == [["app.settings", "ui.view"], ["engine.a", "engine.b"],
                     ["engine.lingbot.model", "engine.models.trunk"]]
    assert engine_packages(modules, edges) == ["engine.lingbot", "engine.zoo"]
    assert violations(edges, ["engine.models"], engine_packages(modules, edges)) == \
        ["engine.models.trunk:4 imports engine.lingbot.model"]
    assert violations(edges, ["ui"], ["app"]) == ["ui.view:4 imports app.settings"]
    assert violations(edges, ["engine"], QT + ("ui", "app")) == []
    assert violations(edges, ["ui"], QT) == ["ui.view:1 imports PySide6.QtWidgets"]


# --- the project ---------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _project():
    return import_graph(REPO)


def test_engine_imports_no_qt_no_ui_no_app():
    _, edges = _project()
    assert violations(edges, ["engine"], QT + ("ui", "app")) == []


def test_models_import_no_engine_package():
    modules, edges = _project()
    packages = engine_packages(modules, edges)
    assert {"engine.lingbot", "engine.vggt", "engine.geometric", "engine.model_zoo"} <= set(packages)
    assert violations(edges, ["engine.models"], packages) == []


def test_ui_does_not_import_app():
    _, edges = _project()
    assert violations(edges, ["ui"], ["app"]) == []


def test_shipped_code_imports_no_benchmark_or_test_code():
    _, edges = _project()
    assert violations(edges, list(TOP), ["benchmarks", "tests"]) == []


def test_no_import_cycles():
    modules, edges = _project()
    found = [sorted(c) for c in cycles(modules, edges)]
    assert found == [], "import cycles (function-level imports included): " + "; ".join(
        " <-> ".join(c) for c in found)
