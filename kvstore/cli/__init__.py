"""The `kvstore` command line: run the servers, look at and change the store, benchmark it.

    main.py     the parser, dispatch, exit codes and the one-line error for every failure
    servers.py  serve, meta, daemon, clean
    data.py     put, get, rm, ls, stat
    top.py      top: the dashboard in a terminal

Nothing imports the CLI; it imports the rest lazily, per command, so `kvstore --help` is quick.
"""

from kvstore.cli.main import main

__all__ = ["main"]
