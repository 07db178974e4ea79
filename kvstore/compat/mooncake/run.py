"""Run unchanged code that imports `mooncake.store` against kvstore.

    python -m kvstore.compat.mooncake.run SCRIPT [ARGS...]
    python -m kvstore.compat.mooncake.run -m MODULE [ARGS...]
    python -m kvstore.compat.mooncake.run --print-path      what to put first on PYTHONPATH instead

The script (or module) runs as __main__ with sys.argv as it would get from `python`, the alias
switched on for it and for every Python process it starts (alias.py). Its Mooncake master address
must name a kvstore metadata service, or set KVSTORE_MOONCAKE_META=HOST:PORT.
"""

from __future__ import annotations

import os
import runpy
import sys

from kvstore.compat.mooncake import alias

USAGE = "usage: python -m kvstore.compat.mooncake.run (SCRIPT | -m MODULE | --print-path) [ARGS...]"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--print-path"]:
        print(os.pathsep.join(alias.search_path()))
        return 0
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        print(USAGE, file=sys.stderr)
        return 2
    alias.install()
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path.insert(len(alias.search_path()), os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
