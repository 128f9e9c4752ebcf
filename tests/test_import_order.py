"""Layers that only point down: every heptstudy import (module level or inside a function) goes
from a layer to the same layer or one below it, no two files import each other even indirectly,
and every module imports cleanly when it is the first heptstudy module a process imports."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "heptstudy"

#: Bottom to top; a module may import from its own layer and the layers before it. Keys are
#: module-name prefixes (the longest matching one wins). The only entry points are the command
#: line's (``heptstudy.__main__``, ``heptstudy.cli.__main__``): a ``__main__`` inside a library
#: layer belongs to that layer, so its import of the command line points up.
LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "heptstudy",
        "heptstudy.config",
        "heptstudy.units",
        "heptstudy.paths",
        "heptstudy.atomic",
        "heptstudy.errors",
        "heptstudy.stand_ins",
        "heptstudy.names",
        "heptstudy.locks",
        "heptstudy.committed",
        "heptstudy.fingerprint",
    ),
    ("heptstudy.data",),
    ("heptstudy.scenario",),
    ("heptstudy.model",),
    ("heptstudy.train",),
    ("heptstudy.meters",),
    ("heptstudy.estimate",),
    ("heptstudy.measure",),
    ("heptstudy.fitting",),
    ("heptstudy.study",),
    ("heptstudy.plots",),
    ("heptstudy.cli", "heptstudy.__main__"),
)


def modules(package: Path) -> dict[str, Path]:
    out = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports(path: Path, known) -> dict[str, int]:
    """heptstudy modules ``path`` imports, anywhere in the file, with a line of each (``from
    pkg import name`` counts as importing ``pkg.name`` when that is a module, else ``pkg``)."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                for a in node.names
            ]
        for name in names:
            if name in known:
                found.setdefault(name, node.lineno)
    return found


def layer_of(module: str) -> int:
    best, level = -1, None
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            exact = prefix == "heptstudy"
            matches = (
                module == prefix if exact else module == prefix or module.startswith(prefix + ".")
            )
            if matches and len(prefix) > best:
                best, level = len(prefix), i
    if level is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")
    return level


def graph(package: Path) -> dict[str, dict[str, int]]:
    mods = modules(package)
    return {m: {k: v for k, v in imports(p, mods).items() if k != m} for m, p in mods.items()}


def upward_imports(package: Path) -> list[str]:
    """``file:line: a imports b`` for every import of a higher layer."""
    mods = modules(package)
    return [
        f"{mods[m].relative_to(package.parent)}:{line}: {m} (layer {layer_of(m)}) imports "
        f"{target} (layer {layer_of(target)})"
        for m, targets in sorted(graph(package).items())
        for target, line in sorted(targets.items())
        if layer_of(target) > layer_of(m)
    ]


def cycles(g: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan). A package's
    ``__init__`` re-exporting its own submodules is no circle: a submodule importing its
    package only reaches the names the package defines itself."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def edges(v: str):
        return [w for w in g[v] if not (w == v.rsplit(".", 1)[0] and v.startswith(w + "."))]

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges(v):
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

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in g:
        if v not in index:
            connect(v)
    return out


def test_every_module_is_in_a_layer():
    for module in modules(PACKAGE):
        layer_of(module)


def test_no_import_points_up():
    assert upward_imports(PACKAGE) == []


def test_no_circle_between_files():
    assert cycles(graph(PACKAGE)) == []


def _fake_tree(root: Path, files: dict[str, str]) -> Path:
    package = root / "heptstudy"
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return package


def test_checker_reports_an_upward_import_inside_a_function(tmp_path):
    package = _fake_tree(
        tmp_path,
        {
            "__init__.py": "",
            "config.py": "",
            "train/__init__.py": "",
            "train/trainer.py": """
                from heptstudy.config import x

                def train():
                    from heptstudy.estimate.plans import predictor_for
                    return predictor_for
                """,
            "measure/__init__.py": "",
            "estimate/__init__.py": "",
            "estimate/plans.py": "from heptstudy.train import trainer\n",
        },
    )
    assert upward_imports(package) == [
        f"heptstudy/train/trainer.py:5: heptstudy.train.trainer (layer {layer_of('heptstudy.train')}) "
        f"imports heptstudy.estimate.plans (layer {layer_of('heptstudy.estimate')})"
    ]
    assert cycles(graph(package)) == [["heptstudy.estimate.plans", "heptstudy.train.trainer"]]


def test_checker_reports_the_estimate_reaching_up_into_measure(tmp_path):
    # the estimate predicts without hardware; the measurement (above it) may use it, never
    # the other way round
    package = _fake_tree(
        tmp_path,
        {
            "__init__.py": "",
            "measure/__init__.py": "",
            "measure/bench.py": "from heptstudy.estimate import plans\n",
            "estimate/__init__.py": "",
            "estimate/plans.py": "",
            "estimate/fake_step.py": "def f():\n    from heptstudy.measure.bench import run\n",
        },
    )
    assert layer_of("heptstudy.estimate") < layer_of("heptstudy.measure")
    assert upward_imports(package) == [
        f"heptstudy/estimate/fake_step.py:2: heptstudy.estimate.fake_step (layer "
        f"{layer_of('heptstudy.estimate')}) imports heptstudy.measure.bench (layer "
        f"{layer_of('heptstudy.measure')})"
    ]


def test_an_entry_point_inside_a_library_layer_points_up(tmp_path):
    package = _fake_tree(
        tmp_path,
        {
            "__init__.py": "",
            "scenario/__init__.py": "",
            "scenario/__main__.py": "from heptstudy.cli.scenario import main\n",
            "cli/__init__.py": "",
            "cli/scenario.py": "",
        },
    )
    assert [line.split(":")[0] for line in upward_imports(package)] == [
        "heptstudy/scenario/__main__.py"
    ]


def test_checker_accepts_downward_and_entry_point_imports(tmp_path):
    package = _fake_tree(
        tmp_path,
        {
            "__init__.py": "",
            "__main__.py": "from heptstudy.cli import main\n",
            "model/__init__.py": "from heptstudy.model.heptv2 import Layer\n",
            "model/heptv2.py": "from heptstudy.model import buckets\n",
            "model/buckets.py": "",
            "cli/__init__.py": "import heptstudy.model\n",
            "cli/__main__.py": "from heptstudy.cli import main\n",
        },
    )
    assert upward_imports(package) == []
    assert cycles(graph(package)) == []


def test_every_module_imports_first():
    # One interpreter; before each module every heptstudy module is forgotten, so each is
    # imported as the first heptstudy module of the process (third-party imports stay cached).
    script = textwrap.dedent(
        f"""
        import importlib, sys, traceback
        from pathlib import Path
        names = {sorted(n for n in modules(PACKAGE) if not n.endswith("__main__"))!r}
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
