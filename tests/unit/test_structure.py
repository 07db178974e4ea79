"""The code's shape, checked: the public API, the 400-line budget, imports that point one way
(DESIGN.md: types/errors <- storage/transport <- meta/daemon <- cli; the client never imports
kvstore.meta; engines only use the client and the shared log format), and no import cycle among kvstore's modules."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import kvstore

REPO = Path(__file__).resolve().parents[2]
BUDGET = 400
GENERATED = ("kvstore/v1/",)
ROOTS = {"kvstore": "kvstore"}
# Layers, lowest first: a module may import its own layer and those below, never above.
LAYERS = [
    (
        "core",
        (
            "kvstore",
            "kvstore.types",
            "kvstore.errors",
            "kvstore.clock",
            "kvstore.config",
            "kvstore.connlimit",
            "kvstore.checksum",
            "kvstore.results",
            "kvstore.results",
            "kvstore.grant",
            "kvstore.hostid",
            "kvstore.logs",
            "kvstore.v1",
            "kvstore.wire",
            "kvstore.jsonlog",
            "kvstore.observe",
            "kvstore.blockhash",
        ),
    ),
    # kvstore.events and kvstore.indexer: KV events' wire, publisher, subscriber and the tables fed by
    # them (sockets and codecs, like a transport); their service side (the store's sink, the admin
    # routes) is in the layer above.
    (
        "storage/transport",
        ("kvstore.storage", "kvstore.transport", "kvstore.metaclient", "kvstore.events", "kvstore.indexer"),
    ),
    (
        "meta/daemon/client",
        (
            "kvstore.meta",
            "kvstore.daemon",
            "kvstore.admin",
            "kvstore.client",
            "kvstore.metrics",
            "kvstore.dashboard",
            "kvstore.server",
            "kvstore.indexer.api",
        ),
    ),
    ("engines", ("kvstore.engines",)),
    ("tools", ("kvstore.bench", "kvstore.compat", "kvstore.cli", "kvstore.__main__")),
]
# kvstore.jsonlog: the request id that follows a request from the router through the engines into
# the client's log lines, and the log format every kvstore process shares.
# kvstore.blockhash: the one block hash that engines' keys, the indexer and the router share; the
# consumer side of KV events (subscriber, wire, the tables that re-hash vLLM's blocks), for the
# router's prefix index. None of them reaches the service's internals.
ENGINES_MAY_USE = (
    "kvstore.engines",
    "kvstore.client",
    "kvstore.config",
    "kvstore.errors",
    "kvstore.jsonlog",
    "kvstore.blockhash",
    "kvstore.events.subscriber",
    "kvstore.events.wire",
    "kvstore.indexer.engine_cache",
    "kvstore.indexer.store_events",
)


def test_the_public_api_is_lazy_and_complete():
    assert {"KVClient", "ClientConfig", "KVStoreError", "KeyNotFound", "NoSpace"} <= set(kvstore.__all__)
    for name in kvstore.__all__:
        assert getattr(kvstore, name) is not None
    code = "import sys, kvstore; print(sorted(m for m in sys.modules if m.startswith(('kvstore.', 'grpc'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"  # `import kvstore` loads nothing else


def python_files() -> list[tuple[str, Path]]:
    """(module name, path) of every module of the package, tests excluded."""
    out = []
    for folder, package in ROOTS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out.append((".".join([package, *parts]), path))
    return out


def test_no_file_is_over_the_line_budget():
    files = [p for p in REPO.rglob("*.py") if not any(part in (".venv", ".git", "build") for part in p.parts)]
    over = {
        str(p.relative_to(REPO)): n
        for p in files
        if not str(p.relative_to(REPO)).startswith(GENERATED) and (n := len(p.read_text().splitlines())) > BUDGET
    }
    assert not over, f"over {BUDGET} lines (split them): {over}"


def module_imports(modules: set[str]) -> dict[str, set[str]]:
    """Each module's kvstore imports at module level (lazy imports inside functions are how layers
    reach up on purpose, and `if TYPE_CHECKING:` blocks are for the type checker only)."""
    graph: dict[str, set[str]] = {}
    for name, path in python_files():
        found: set[str] = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found |= {
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                    for a in node.names
                }
        graph[name] = {m for m in found if m.startswith("kvstore")}
    return graph


def within(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def layer_of(module: str) -> int:
    best = (-1, -1)
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best[1]:
                best = (i, len(p))
    assert best[0] >= 0, f"{module} is in no layer: add it to LAYERS"
    return best[0]


def test_imports_point_one_way():
    modules = {name for name, _ in python_files()}
    wrong = []
    for module, imports in module_imports(modules).items():
        for target in imports:
            if layer_of(target) > layer_of(module):
                wrong.append(
                    f"{module} -> {target} ({LAYERS[layer_of(target)][0]} is above {LAYERS[layer_of(module)][0]})"
                )
            if within(module, "kvstore.client") and within(target, "kvstore.meta", "kvstore.daemon"):
                wrong.append(f"{module} -> {target}: the client never imports the service's internals")
            if within(module, "kvstore.engines") and not within(target, *ENGINES_MAY_USE):
                wrong.append(f"{module} -> {target}: engines use only the client (and its config and errors)")
            if within(target, "kvstore.cli") and not within(module, "kvstore.cli", "kvstore.__main__"):
                wrong.append(f"{module} -> {target}: nothing imports the CLI")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles():
    modules = {name for name, _ in python_files()}
    graph = module_imports(modules)
    # A package's __init__ runs before its submodules: an edge to a package is an edge to its __init__.
    edges = {m: {t for t in targets if t in graph and t != m} for m, targets in graph.items()}
    assert sum(map(len, edges.values())) > 100, "the import graph came out empty: the check would be vacuous"
    seen, on_path, cycles = set(), [], []

    def visit(node: str) -> None:
        if node in on_path:
            cycles.append(on_path[on_path.index(node) :] + [node])
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
