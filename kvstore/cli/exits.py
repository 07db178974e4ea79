"""Exit codes of the `kvstore` command, and the parser that turns a usage error into one line."""

from __future__ import annotations

import argparse
import sys
from enum import IntEnum
from typing import NoReturn


class Exit(IntEnum):
    OK = 0
    ERROR = 1  # the command failed: the message says why and what to do
    USAGE = 2  # the command line is wrong
    EXISTS = 3  # put: the key is already stored, and was kept (pass --replace to overwrite)
    NOT_FOUND = 4  # get, rm, stat KEY: a key is not stored
    INTERRUPTED = 130


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line: `kvstore CMD: error: ...`, exit 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(Exit.USAGE)


def formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.HelpFormatter(prog, max_help_position=32, width=110)
