"""The layers point one way. Every import in rstar/, tasks/ and flows/ (at module level or
inside a function: both are arrows) goes to its own layer or one below, the library never
imports the orchestration above it, no packages import each other round a cycle, and a recipe
loads without torch or verl. docs/architecture.md draws the same layers."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# bottom to top; a package may import its own layer and the ones below it
LAYERS = [
    {
        "rstar",
        "rstar.errors",
        "rstar.environment",
        "rstar.logs",
        "rstar.storage",
        "rstar.cluster",
        "rstar.machine",
    },
    {"rstar.tracking", "rstar.sandbox", "rstar.reward", "rstar.algo"},
    {"rstar.data"},
    {"rstar.agent"},
    {"rstar.rollout"},
    {"rstar.model"},
    {"rstar.eval", "rstar.train"},
    {"rstar.pipeline"},
    {"rstar.bench"},
    {"rstar.cli"},
    {"tasks"},
    {"flows"},
]
LAYER = {package: i for i, layer in enumerate(LAYERS) for package in layer}


def package_of(module: str) -> str:
    """rstar.<package> (or the module directly under rstar), tasks, flows."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "rstar" else parts[0]


def imports(root: Path) -> list[tuple[str, str, str]]:
    """(file, its package, the module it imports) for every import of one of the project's."""
    found = []
    for top in ("rstar", "tasks", "flows"):
        for path in sorted((root / top).rglob("*.py")):
            module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(
                ".__init__"
            )
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                found += [
                    (str(path.relative_to(root)), package_of(module), n)
                    for n in names
                    if n.split(".")[0] in ("rstar", "tasks", "flows")
                ]
    return found


def into_orchestration(root: Path) -> list[str]:
    """Imports of flows or tasks by the library."""
    return [
        f"{f}: {n}"
        for f, package, n in imports(root)
        if package.startswith("rstar") and n.split(".")[0] in ("flows", "tasks")
    ]


def upward(root: Path) -> list[str]:
    """Imports of a higher layer than the importing package's."""
    return [
        f"{f}: {n} (layer {LAYER[package_of(n)]} from layer {LAYER[package]})"
        for f, package, n in imports(root)
        if LAYER[package_of(n)] > LAYER[package]
    ]


def cycles(root: Path) -> list[str]:
    """Packages that reach themselves through other packages' imports."""
    edges: dict[str, set[str]] = {}
    for _, package, n in imports(root):
        if package_of(n) != package:
            edges.setdefault(package, set()).add(package_of(n))

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(
            nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt}))
            for nxt in edges.get(start, ())
        )

    return sorted(p for p in edges if reaches(p, p, {p}))


def test_every_package_has_a_layer():
    found = imports(ROOT)
    packages = {package for _, package, _ in found} | {package_of(n) for _, _, n in found}
    assert packages <= set(LAYER), sorted(packages - set(LAYER))


def test_the_library_never_imports_flows_or_tasks():
    assert into_orchestration(ROOT) == []


def test_imports_go_to_the_same_layer_or_below():
    assert upward(ROOT) == []


def test_no_package_cycles():
    assert cycles(ROOT) == []


def test_the_checks_catch_an_import_of_the_flows_an_arrow_up_and_a_cycle(tmp_path):
    """The same checks on a copy of the tree with bad imports added: each is found."""
    for top in ("rstar", "tasks", "flows"):
        shutil.copytree(ROOT / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "rstar" / "sandbox" / "bad.py").write_text("from flows.pipeline import pipeline\n")
    assert into_orchestration(tmp_path) == ["rstar/sandbox/bad.py: flows.pipeline"]
    (tmp_path / "rstar" / "sandbox" / "bad.py").unlink()
    # a function-level import of the rollout runner by the data package: up a layer, and a cycle
    # (the rollout package reads data files)
    (tmp_path / "rstar" / "data" / "bad.py").write_text(
        "def f():\n    from rstar.rollout.runner import rollout\n"
    )
    (tmp_path / "rstar" / "rollout" / "bad.py").write_text("from rstar.data.io import read_table\n")
    assert upward(tmp_path) == ["rstar/data/bad.py: rstar.rollout.runner (layer 4 from layer 2)"]
    assert cycles(tmp_path) == ["rstar.data", "rstar.rollout"]


def test_a_recipe_loads_without_torch_or_verl():
    probe = (
        "import sys\nimport rstar.pipeline.config\n"
        "print(sorted(m for m in ('torch', 'verl', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1:] == ["[]"], (
        out.stdout + out.stderr
    )
