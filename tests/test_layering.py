"""The package layering of ``src/longsparse`` (docs/architecture.md): every import — at module level, inside a
function or under ``TYPE_CHECKING`` — goes down :data:`ALLOWED` (ops ← cache ← models ← engine ← cli, serve, with
the tensor-parallel group of ``distributed`` below the models; eval, train and bench above the engine, sharing
``tasks`` and ``reports`` and never importing one another), and no module imports, directly or through others, a
module that imports it back."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "longsparse"

_BELOW_APPS = {"engine", "models", "distributed", "cache", "ops", "tasks", "reports", "info", "cli_args", "_optional"}
ALLOWED: dict[str, set[str]] = {
    "_optional": set(),
    "cli_args": {"ops"},
    "ops": {"_optional"},
    "cache": {"ops", "_optional"},
    "distributed": set(),
    "models": {"distributed", "cache", "ops", "_optional"},
    "engine": {"models", "distributed", "cache", "ops", "cli_args", "_optional"},
    "serve": {"engine", "models", "distributed", "cache", "ops", "reports", "info", "cli_args", "_optional"},
    "info": {ROOT, "ops", "cli_args", "_optional"},
    "tasks": {"_optional"},
    "reports": {"info", "_optional"},
    "eval": _BELOW_APPS,
    "train": _BELOW_APPS,
    "bench": _BELOW_APPS,
    "cli": {
        ROOT,
        "engine",
        "eval",
        "train",
        "bench",
        "serve",
        "models",
        "distributed",
        "cache",
        "ops",
        "info",
        "cli_args",
        "_optional",
    },
    ROOT: {"engine"},
}
"""Top-level package (or module) -> the top-level packages it may import besides itself. ``longsparse`` is the
package's ``__init__`` (its lazy ``LLM``); ``info`` and ``cli`` read ``longsparse.__version__`` from it.
``cli_args`` is the commands' shared parser: the standard library, and the ops configs inside its parsers."""


def module_files(src: Path) -> dict[str, Path]:
    """``longsparse.x.y`` -> its file, for every module under ``src / longsparse`` (a package is its ``__init__``)."""
    names = {}
    for path in sorted((src / ROOT).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[int, str]]:
    """``(line, module)`` for every module of ``modules`` that module ``name`` imports (``from pkg import sub``
    names the submodule when ``sub`` is one, else ``pkg``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module) if p)
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names]
        else:
            continue
        for target in targets:
            while target not in modules and "." in target:
                target = target.rpartition(".")[0]
            if target in modules and target != name:
                found.append((node.lineno, target))
    return sorted(set(found))


def top(module: str) -> str:
    """The top-level package (or module) of ``module``; the package itself is :data:`ROOT`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT


def layering_violations(src: Path, allowed: dict[str, set[str]]) -> list[str]:
    """``file:line imports module (why)`` for every import against ``allowed``, and each package it lacks."""
    modules = module_files(src)
    out = [
        f"package {p!r} is missing from the layering table" for p in sorted({top(m) for m in modules} - set(allowed))
    ]
    for name, path in modules.items():
        for line, target in imports_of(name, path, modules):
            here, there = top(name), top(target)
            if here in allowed and there != here and there not in allowed[here]:
                may = ", ".join(sorted(allowed[here])) or "nothing else"
                out.append(f"{path.relative_to(src.parent)}:{line} imports {target} ({here} may import: {may})")
    return out


def find_cycles(edges: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return cycles


def import_cycles(src: Path) -> list[list[str]]:
    modules = module_files(src)
    return find_cycles({name: sorted({t for _, t in imports_of(name, p, modules)}) for name, p in modules.items()})


def test_every_import_goes_down_the_layers():
    bad = layering_violations(SRC, ALLOWED)
    assert not bad, "imports against the layering (tests/test_layering.py: ALLOWED):\n" + "\n".join(bad)


def test_no_module_imports_itself_back():
    cycles = import_cycles(SRC)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_table_is_acyclic_and_the_checks_catch_an_upward_import_and_a_circle(tmp_path):
    assert find_cycles({package: sorted(allowed) for package, allowed in ALLOWED.items()}) == []
    files = {
        "__init__.py": "",
        "cache/__init__.py": "from .store import Store\n",
        "cache/store.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..models.batch import Batch\n",
        "models/__init__.py": "",
        "models/batch.py": "def make():\n    from longsparse.cache import store\n",
        "models/other.py": "from . import batch\n",
        "widgets/__init__.py": "",
    }
    for name, text in files.items():
        (tmp_path / ROOT / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / ROOT / name).write_text(text)
    bad = layering_violations(tmp_path, ALLOWED)
    assert bad == [
        "package 'widgets' is missing from the layering table",
        f"{Path(tmp_path.name, ROOT, 'cache', 'store.py')}:3 imports longsparse.models.batch "
        "(cache may import: _optional, ops)",
    ]
    assert import_cycles(tmp_path) == [["longsparse.cache.store", "longsparse.models.batch"]]
