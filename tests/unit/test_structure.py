"""The code's shape, checked: the public API, the 400-line budget, imports that point one way by
folder (DESIGN.md: leaves <- config/wire <- libraries <- the store <- processes <- integrations <-
commands; the client never imports the service's internals; the engines and compat APIs only use
the client), lazy imports included and counted, and no import cycle among the project's modules."""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import kvstore

REPO = Path(__file__).resolve().parents[2]
BUDGET = 400
MOST = 300  # most files stay under this; the test prints those over it
GENERATED = ("kvstore/v1/",)
# Top-level folders holding importable code, tests excluded (benchmarks/ is the repo's lab, not shipped).
ROOTS = ("kvstore", "benchmarks")
# Layers by folder, lowest first: a module may import its own layer and those below, never above,
# lazily or not. The modules at the top of kvstore/ (values and small leaves) are the lowest layer;
# the facade `kvstore` (kvstore/__init__.py, whose lazy __getattr__ reaches the client) the highest.
LEAVES = "leaves"
LAYERS = [
    (LEAVES, ("kvstore.v1",)),  # plus every module at the top of kvstore/
    ("config/wire", ("kvstore.config", "kvstore.wire")),
    (
        "libraries",
        (
            "kvstore.storage",
            "kvstore.transport",
            "kvstore.metaclient",
            "kvstore.events",
            "kvstore.indexer",
            "kvstore.admin",
        ),
    ),
    ("store", ("kvstore.meta", "kvstore.metrics", "kvstore.dashboard")),
    ("processes", ("kvstore.server", "kvstore.daemon", "kvstore.client")),
    ("integrations", ("kvstore.engines", "kvstore.compat", "kvstore.bench")),
    ("commands", ("kvstore.cli", "kvstore.__main__", "kvstore")),
    ("lab", ("benchmarks",)),
]
# What the engine integrations and the compat APIs may import besides themselves and the leaves:
# the client and its settings and errors, and the consumer side of KV events and the indexer's
# tables (the router's prefix index), never the service's internals.
INTEGRATIONS_MAY_USE = ("kvstore.client", "kvstore.config", "kvstore.events", "kvstore.indexer")
# Imports inside functions and under `if TYPE_CHECKING:` obey the layers too; their numbers may
# only go down (a ratchet: lower them when you remove some).
LAZY_MAX = {"function": 106, "typing": 24}


def test_the_public_api_is_lazy_and_complete():
    assert {"KVClient", "ClientConfig", "KVStoreError", "KeyNotFound", "NoSpace"} <= set(kvstore.__all__)
    for name in kvstore.__all__:
        assert getattr(kvstore, name) is not None
    code = "import sys, kvstore; print(sorted(m for m in sys.modules if m.startswith(('kvstore.', 'grpc'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"  # `import kvstore` loads nothing else


def python_files() -> list[tuple[str, Path]]:
    """(module name, path) of every module under ROOTS."""
    out = []
    for folder in ROOTS:
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO).with_suffix("")
            out.append((".".join(p for p in rel.parts if p != "__init__"), path))
    return out


def test_no_file_is_over_the_line_budget():
    files = [p for p in REPO.rglob("*.py") if not any(part in (".venv", ".git", "build") for part in p.parts)]
    sizes = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in files}
    sizes = {name: n for name, n in sizes.items() if not name.startswith(GENERATED)}
    over = {name: n for name, n in sizes.items() if n > BUDGET}
    most = sorted((n, name) for name, n in sizes.items() if MOST < n <= BUDGET)
    print(f"{len(most)} files over {MOST} lines:", ", ".join(f"{name} {n}" for n, name in most))
    assert not over, f"over {BUDGET} lines (split them): {over}"


@dataclass(frozen=True)
class Import:
    target: str
    lazy: str  # "" (at import time), "function" (inside one) or "typing" (under `if TYPE_CHECKING:`)
    line: int


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports_of(tree: ast.Module, modules: set[str]) -> list[Import]:
    found: list[Import] = []

    def walk(node: ast.AST, lazy: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = lazy
            if not inner and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = "function"
            elif not inner and _is_type_checking(child):
                inner = "typing"
            if isinstance(child, ast.Import):
                found.extend(Import(a.name, lazy, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                for a in child.names:
                    name = f"{child.module}.{a.name}"
                    found.append(Import(name if name in modules else child.module, lazy, child.lineno))
            walk(child, inner)

    walk(tree, "")
    return list(dict.fromkeys(i for i in found if i.target.split(".")[0] in ROOTS))


def module_imports(modules: set[str], lazy: bool = True) -> dict[str, list[Import]]:
    """Each module's imports of the project's modules (lazy ones too unless told otherwise)."""
    return {
        name: [i for i in _imports_of(ast.parse(path.read_text()), modules) if lazy or not i.lazy]
        for name, path in python_files()
    }


def within(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def layer_of(module: str) -> int:
    if (
        module.startswith("kvstore.")
        and module.count(".") == 1
        and (REPO / (module.replace(".", "/") + ".py")).exists()
    ):
        return 0 if module != "kvstore.__main__" else len(LAYERS) - 2
    best = (-1, -1)
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best[1]:
                best = (i, len(p))
    assert best[0] >= 0, f"{module} is in no layer: add its folder to LAYERS"
    return best[0]


def test_every_folder_has_a_layer():
    packages = {f"kvstore.{p.name}" for p in (REPO / "kvstore").iterdir() if (p / "__init__.py").exists()}
    named = {p for _, prefixes in LAYERS for p in prefixes}
    assert packages <= named, f"folders in no layer: {sorted(packages - named)}"
    assert not {p for p in named - packages if p.startswith("kvstore.") and p != "kvstore.__main__"}, "stale names"


def test_imports_point_one_way():
    modules = {name for name, _ in python_files()}
    wrong = []
    for module, imports in module_imports(modules).items():
        for imp in imports:
            target, where = imp.target, f"{module}:{imp.line} -> {imp.target}" + (f" ({imp.lazy})" if imp.lazy else "")
            if layer_of(target) > layer_of(module):
                wrong.append(f"{where}: {LAYERS[layer_of(target)][0]} is above {LAYERS[layer_of(module)][0]}")
            if within(module, "kvstore.client") and within(target, "kvstore.meta", "kvstore.server", "kvstore.daemon"):
                wrong.append(f"{where}: the client never imports the service's internals")
            if (
                within(module, "kvstore.engines", "kvstore.compat")
                and layer_of(target) > 0
                and not within(target, "kvstore.engines", "kvstore.compat", *INTEGRATIONS_MAY_USE)
            ):
                wrong.append(f"{where}: integrations use only the client (and its config, errors, events)")
            if within(target, "kvstore.cli") and not within(module, "kvstore.cli", "kvstore.__main__", "benchmarks"):
                wrong.append(f"{where}: nothing imports the CLI")
            if within(target, "benchmarks", "tests") and not within(module, "benchmarks"):
                wrong.append(f"{where}: the product never imports the benchmarks or the tests")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("kind", sorted(LAZY_MAX))
def test_lazy_imports_only_go_down_in_number(kind):
    modules = {name for name, _ in python_files()}
    graph = module_imports(modules)
    lazy = [f"{m}:{i.line} -> {i.target}" for m, imports in graph.items() for i in imports if i.lazy == kind]
    print(f"{len(lazy)} {kind} imports")
    assert len(lazy) <= LAZY_MAX[kind], f"{len(lazy)} {kind} imports (at most {LAZY_MAX[kind]}):\n" + "\n".join(lazy)


def test_no_import_cycles():
    modules = {name for name, _ in python_files()}
    graph = module_imports(modules)
    # A package's __init__ runs before its submodules: an edge to a package is an edge to its __init__.
    # Lazy edges count: a cycle through a function-level import is still a cycle in the design.
    edges = {m: {i.target for i in imports if i.target in graph and i.target != m} for m, imports in graph.items()}
    assert sum(map(len, edges.values())) > 100, "the import graph came out empty: the check would be vacuous"
    seen: set[str] = set()
    on_path: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        if node in on_path:
            cycles.append([*on_path[on_path.index(node) :], node])
            return
        if node in seen:
            return
        seen.add(node)
        on_path.append(node)
        for nxt in sorted(edges.get(node, ())):
            visit(nxt)
        on_path.pop()

    for module in sorted(edges):
        visit(module)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)
