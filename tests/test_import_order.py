"""No import loop: the package's module-level imports form no cycle, scenario and fitting do not
reach back into each other even through imports inside functions, and every module imports
cleanly when it is the first heptstudy module a process imports."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "heptstudy"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(path: Path, known, inside_functions: bool) -> set[str]:
    """heptstudy modules ``path`` imports (``from pkg import name`` counts as importing the
    submodule when ``pkg.name`` is one, else the package itself)."""
    found: set[str] = set()

    def visit(node, at_top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            counted = at_top or inside_functions
            if counted and isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.startswith("heptstudy"))
            elif counted and isinstance(child, ast.ImportFrom) and child.level == 0:
                mod = child.module or ""
                if mod.startswith("heptstudy"):
                    found.update(
                        f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod
                        for a in child.names
                    )
            in_function = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            visit(child, at_top and not in_function)

    visit(ast.parse(path.read_text()), True)
    return {m for m in found if m in known}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            connect(v)
    return out


def _graph(inside_functions: bool) -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(p, mods, inside_functions) - {m} for m, p in mods.items()}


def test_module_level_imports_have_no_cycle():
    assert _cycles(_graph(inside_functions=False)) == []


def test_scenario_and_fitting_do_not_loop_even_through_function_imports():
    loops = [
        c
        for c in _cycles(_graph(inside_functions=True))
        if any(m.startswith(("heptstudy.scenario", "heptstudy.fitting")) for m in c)
    ]
    assert loops == []


def test_every_module_imports_first():
    # One interpreter; before each module every heptstudy module is forgotten, so each is
    # imported as the first heptstudy module of the process (third-party imports stay cached).
    script = textwrap.dedent(
        f"""
        import importlib, sys, traceback
        from pathlib import Path
        names = {sorted(n for n in _modules() if not n.endswith("__main__"))!r}
        failed = []
        for name in names:
            for loaded in [k for k in sys.modules if k.split(".")[0] == "heptstudy"]:
                del sys.modules[loaded]
            try:
                importlib.import_module(name)
            except Exception:
                failed.append(name + ": " + traceback.format_exc(limit=3))
        print("\\n".join(failed))
        sys.exit(1 if failed else 0)
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=PACKAGE.parent
    )
    assert run.returncode == 0, run.stdout + run.stderr
