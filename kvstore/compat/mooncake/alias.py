"""The opt-in alias: `mooncake.store` resolves to kvstore's Mooncake-compatible API.

Off by default: nothing here runs unless asked, and the installed `mooncake` package is left as
it is. Switched on by putting `alias_path/` first on the module search path, for a process and
every Python process it starts:

    python -m kvstore.compat.mooncake.run SCRIPT|-m MODULE [ARGS...]     (calls install())
    PYTHONPATH=$(python -m kvstore.compat.mooncake.run --print-path)     (the env switch)

`alias_path/mooncake/` is a stand-in package whose `store` module is kvstore.compat.mooncake; the
rest of the package (mooncake.engine, the binaries, ...) still comes from the real wheel, when it
is installed: `adopt` puts the real package's directories after the stand-in's on its __path__
and runs the real package's __init__. Without the wheel only `mooncake.store` exists.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path
from typing import Any

ALIAS_PATH = str(Path(__file__).resolve().parent / "alias_path")
_STAND_IN = os.path.join(ALIAS_PATH, "mooncake")


def search_path() -> list[str]:
    """What goes first on the module search path: the stand-in's directory, then, when kvstore
    runs from a source tree rather than an installed wheel, that tree (so a child process's
    `import kvstore` finds this kvstore, whatever else is installed)."""
    root = str(Path(__file__).resolve().parents[3])  # kvstore/compat/mooncake/alias.py: the tree holding kvstore/
    installed = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")}
    return [ALIAS_PATH] if os.path.realpath(root) in installed else [ALIAS_PATH, root]


def install() -> None:
    """Switch the alias on in this process and in the processes it starts (PYTHONPATH). Modules
    of the real package imported before are dropped, so the next import goes through the alias."""
    first = search_path()
    sys.path[:0] = [p for p in first if p not in sys.path[: len(first)]]
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in first]
    os.environ["PYTHONPATH"] = os.pathsep.join([*first, *parts])
    for name in [m for m in sys.modules if m == "mooncake" or m.startswith("mooncake.")]:
        module = sys.modules[name]
        if not str(getattr(module, "__file__", "") or "").startswith(ALIAS_PATH):
            del sys.modules[name]


def real_package_dirs() -> list[str]:
    """The directories of the installed `mooncake` package, if any (never the stand-in)."""
    found = []
    for entry in sys.path:
        folder = os.path.join(entry or os.getcwd(), "mooncake")
        if os.path.abspath(folder) != _STAND_IN and os.path.isdir(folder) and folder not in found:
            found.append(folder)
    return found


def adopt(namespace: dict[str, Any]) -> None:
    """Called by the stand-in package's __init__ with its globals: the stand-in first on its
    __path__ (so `mooncake.store` is kvstore's), then the real package, whose __init__ runs."""
    real = real_package_dirs()
    namespace["__path__"] = [_STAND_IN, *real]
    for folder in real:
        init = os.path.join(folder, "__init__.py")
        if os.path.isfile(init):
            with open(init, encoding="utf-8") as fh:
                code = compile(fh.read(), init, "exec")
            exec(code, namespace)
            break
