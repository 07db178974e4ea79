"""The one loader of settings: `load_config(cls, toml_path, env, overrides)` layers, lowest to
highest precedence, a config class's defaults, a TOML file (the table named cls.SECTION),
environment variables, then explicit overrides (the flags a user gave). Values from TOML and env
are converted to the field's declared type; sizes may carry units (parse_size)."""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

from kvstore.errors import InvalidArgument


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise InvalidArgument(message)


def parse_size(value: str | int) -> int:
    """'64MiB', '1G', '4096' -> bytes; ValueError, with examples, for anything else (load_config
    and the flags turn it into InvalidArgument naming the setting)."""
    if isinstance(value, int):
        return value
    try:
        size = _parse_size(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a size: give bytes or a number with a unit (4096, 512MiB, 4GiB)") from None
    if size < 0:
        raise ValueError(f"{value!r} is not a size: it is negative")
    return size


def _parse_size(value: str) -> int:
    text = value.strip().lower().replace(" ", "")
    units = {
        "kib": 1 << 10,
        "mib": 1 << 20,
        "gib": 1 << 30,
        "tib": 1 << 40,
        "k": 1 << 10,
        "m": 1 << 20,
        "g": 1 << 30,
        "t": 1 << 40,
        "kb": 1000,
        "mb": 10**6,
        "gb": 10**9,
        "b": 1,
    }
    for suffix in sorted(units, key=len, reverse=True):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * units[suffix])
    return int(text)


C = TypeVar("C")


def section_of(cls: type[Any]) -> str:
    """The TOML table and env prefix of a config class."""
    section = getattr(cls, "SECTION", None)
    if not isinstance(section, str):
        raise TypeError(f"{cls.__name__} is not a config class: it has no SECTION")
    return section


def env_name(cls: type[Any], name: str) -> str:
    """The environment variable that sets field `name` of config class `cls`."""
    shared: dict[str, str] = getattr(cls, "ENV", {})
    return shared.get(name) or f"KVSTORE_{section_of(cls).upper()}_{name.upper()}"


def field_types(cls: type[Any]) -> dict[str, Any]:
    """Each field's declared type, resolved (annotations are strings in these modules)."""
    hints = get_type_hints(cls)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls)}


def convert_value(value: Any, target: Any) -> Any:
    """`value` (from TOML, env or a flag) as a field of type `target`; ValueError if it is not one."""
    if isinstance(target, type) and issubclass(target, Enum):
        try:
            return target(value)
        except ValueError:
            choices = ", ".join(str(m.value) for m in target)
            raise ValueError(f"{value!r} is not one of {choices}") from None
    origin = getattr(target, "__origin__", None)
    if isinstance(value, str):
        if target is bool:
            return _bool(value)
        if target is int:
            if value.strip().lstrip("-").isdigit():  # a plain integer, negative ones too (-1: off)
                return int(value)
            return parse_size(value)
        if target is float:
            return float(value)
        if origin is tuple:
            return tuple(v.strip() for v in value.split(",") if v.strip())
        return value
    if origin is tuple and isinstance(value, list | tuple):
        return tuple(value)
    if target is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if target is bool and not isinstance(value, bool):
        return _bool(str(value))
    return value


def _bool(text: str) -> bool:
    word = text.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{text!r} is not a yes/no value (true, false, 1, 0, yes, no, on, off)")


def read_toml(path: str | Path) -> dict[str, Any]:
    """A TOML file's tables; InvalidArgument (naming the file) if it is missing or malformed."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise InvalidArgument(f"config file {path} does not exist") from None
    except IsADirectoryError:
        raise InvalidArgument(f"config file {path} is a directory: give a TOML file") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument(f"config file {path} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise InvalidArgument(f"cannot read config file {path}: {exc.strerror}") from None


def load_config(
    cls: type[C], toml_path: str | Path | None = None, env: Mapping[str, str] | None = None, **overrides: Any
) -> C:
    """Build `cls` from defaults < TOML file < env < overrides (None in overrides means "not
    given"). InvalidArgument names the setting and where it came from."""
    env = os.environ if env is None else env
    section = section_of(cls)
    types = field_types(cls)
    values: dict[str, tuple[Any, str]] = {}
    if toml_path:
        table = read_toml(toml_path).get(section, {})
        _require(isinstance(table, dict), f"[{section}] in {toml_path} must be a table")
        unknown = set(table) - set(types)
        _require(
            not unknown, f"unknown [{section}] settings in {toml_path}: {sorted(unknown)} (known: {sorted(types)})"
        )
        values.update({k: (v, f"[{section}] {k} in {toml_path}") for k, v in table.items()})
    for name in types:
        var = env_name(cls, name)
        if var in env:
            values[name] = (env[var], f"${var}")
    given = {k: v for k, v in overrides.items() if v is not None}
    unknown = set(given) - set(types)
    _require(not unknown, f"unknown {section} settings: {sorted(unknown)}; known: {sorted(types)}")
    values.update({k: (v, k) for k, v in given.items()})
    converted = {}
    for name, (value, source) in values.items():
        try:
            converted[name] = convert_value(value, types[name])
        except (ValueError, InvalidArgument) as exc:
            raise InvalidArgument(f"bad {section} setting {source}: {exc}") from None
    return cls(**converted)
