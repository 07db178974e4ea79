"""Command-line flags made from the config dataclasses: one flag per field, so a new field gets
its flag (and, through kvstore.config.load_config, its TOML key and env variable) from its
declaration alone.

A flag's default is "not given" (argparse.SUPPRESS): only flags the user typed reach
load_config, which puts them above env, the --config file and the defaults. The help of each flag
shows the field's default and its env variable; its text is the comment on the field's line (or
the comment lines just above it) in kvstore/config/.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import io
import tokenize
from collections.abc import Collection, Mapping
from enum import Enum
from typing import Any, TypeVar

from kvstore.config.load import convert_value, env_name, field_types, load_config, section_of
from kvstore.errors import InvalidArgument

C = TypeVar("C")


class ConfigFlags:
    """The config flags of one command: which flag sets which (section, field)."""

    def __init__(self) -> None:
        self._targets: dict[str, list[tuple[str, str]]] = {}  # argparse dest -> (section, field)s
        self._flags: set[str] = set()

    def add(
        self,
        parser: argparse.ArgumentParser,
        cls: type[Any],
        aliases: Mapping[str, str] | None = None,
        skip: Collection[str] = (),
        share: Collection[str] = (),
    ) -> None:
        """Add a flag to `parser` for every field of `cls` but `skip`. `aliases` renames flags
        (field -> flag without dashes). A field whose flag an earlier `add` made is set by that
        flag too if it is in `share`; otherwise it gets the flag `--SECTION-NAME`."""
        section = section_of(cls)
        group = parser.add_argument_group(
            f"[{section}] settings", f"each also $KVSTORE_{section.upper()}_<NAME> or [{section}] in --config"
        )
        helps = field_help(cls)
        types = field_types(cls)
        for f in dataclasses.fields(cls):
            if f.name in skip:
                continue
            flag = (aliases or {}).get(f.name, f.name.replace("_", "-"))
            if flag in self._flags and f.name in share:
                self._targets[_dest(flag)].append((section, f.name))
                continue
            if flag in self._flags:
                flag = f"{section}-{flag}"
            self._flags.add(flag)
            self._targets[_dest(flag)] = [(section, f.name)]
            default = f.default if f.default is not dataclasses.MISSING else None
            text = f"{helps.get(f.name, '')} (default: {_show(f.name, default)}; env {env_name(cls, f.name)})"
            kind = types[f.name]
            kwargs: dict[str, Any] = {
                "dest": _dest(flag),
                "default": argparse.SUPPRESS,
                "help": text.strip().replace("%", "%%"),
            }
            if kind is bool:
                group.add_argument(f"--{flag}", action=argparse.BooleanOptionalAction, **kwargs)
            else:
                metavar = "SIZE" if kind is int and _is_size(f.name) else f.name.split("_")[-1].upper()
                group.add_argument(f"--{flag}", type=_converter(flag, kind), metavar=metavar, **kwargs)

    def given(self, cls: type[Any], args: argparse.Namespace) -> dict[str, Any]:
        """The fields of `cls` whose flags the user gave, with their values."""
        section = section_of(cls)
        out: dict[str, Any] = {}
        for dest, targets in self._targets.items():
            if hasattr(args, dest):
                out.update({name: getattr(args, dest) for sec, name in targets if sec == section})
        return out

    def load(self, cls: type[C], args: argparse.Namespace, **fixed: Any) -> C:
        """`cls` from the flags given > env > args.config (a TOML file) > defaults; `fixed`
        values (decided by the command itself) beat all of them."""
        return load_config(cls, getattr(args, "config", None), None, **{**self.given(cls, args), **fixed})


def _dest(flag: str) -> str:
    return "cfg_" + flag.replace("-", "_")


def _is_size(name: str) -> bool:
    return name.endswith(("_size", "_bytes"))


def _show(name: str, default: Any) -> str:
    if isinstance(default, tuple):
        return ",".join(map(str, default)) or "none"
    if isinstance(default, Enum):
        return str(default.value)
    if isinstance(default, int) and not isinstance(default, bool) and _is_size(name) and default >= 1 << 20:
        for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20)):
            if default % (1 << shift) == 0:
                return f"{default >> shift}{unit}"
    if default == "":
        return "none"
    return str(default)


def _converter(flag: str, kind: Any) -> Any:
    """argparse's `type` for a field: the loader's own conversion, its errors as one line."""

    def convert(text: str) -> Any:
        try:
            return convert_value(text, kind)
        except (ValueError, InvalidArgument) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = flag  # argparse names the type in some messages
    return convert


def field_help(cls: type[Any]) -> dict[str, str]:
    """Each field's comment in its class's source: on the field's line, else the comment lines
    right above it. Empty where there is none (or the source is not shipped)."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    names = {f.name for f in dataclasses.fields(cls)}
    out: dict[str, str] = {}
    above: list[str] = []
    line_of_field: dict[int, str] = {}
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.NAME and tok.string in names and tok.start[1] == 4 and tokens[i + 1].string == ":":
            line_of_field[tok.start[0]] = tok.string
            if above:
                out[tok.string] = " ".join(above)
            above = []
        elif tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            if tok.start[0] in line_of_field:
                out[line_of_field[tok.start[0]]] = text
            else:
                above.append(text)
        elif tok.type == tokenize.NEWLINE:
            above = []
    return out
