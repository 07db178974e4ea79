"""The docs name what the code has: every registered transport, every CLI command, every config
field and every package appears in the README or docs/, so a new one cannot land undocumented."""

import dataclasses
import os
import re
from pathlib import Path

from kvstore.cli.main import COMMANDS, ENGINE_COMMANDS
from kvstore.config import ClientConfig, DaemonConfig, MetaConfig
from kvstore.hostid import host_id
from kvstore.transport import registry

REPO = Path(__file__).resolve().parents[2]
DOCS = "\n".join(p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))])


def test_every_transport_is_documented():
    for name in registry.names():
        assert f"`{name}`" in DOCS, f"transport {name} is not in the docs"


def test_readme_layout_lists_exactly_the_registered_transports():
    layout = (REPO / "README.md").read_text().split("## Layout", 1)[1]
    line = re.search(r"^\s*transport/\s+interface \+ registry · (.*)$", layout, re.M)
    assert line, "the README's layout section has no `transport/  interface + registry · ...` line"
    assert sorted(line.group(1).split(" · ")) == sorted(registry.names())


def _layout_folders() -> tuple[set[str], set[str]]:
    """(top-level folders, folders under kvstore/) the README's Layout block names."""
    block = (REPO / "README.md").read_text().split("## Layout", 1)[1].split("```", 2)[1]
    top, inner = set(), set()
    for line in block.splitlines():
        if m := re.match(r"^(\S+)/\s", line):
            top.add(m.group(1).split("/")[0])
        elif m := re.match(r"^  (\w+)/\s", line):
            inner.add(m.group(1))
    return top, inner


def test_readme_layout_names_exactly_the_packages():
    top, inner = _layout_folders()
    packages = {p.name for p in (REPO / "kvstore").iterdir() if (p / "__init__.py").exists()} - {"v1"}
    assert inner == packages, f"README Layout vs kvstore/: missing {packages - inner}, stale {inner - packages}"
    assert {"proto", "kvstore", "benchmarks", "examples", "tests"} <= top
    assert all((REPO / name).is_dir() for name in top), f"the Layout names folders that do not exist: {top}"


def _proto_address_formats() -> dict[str, str]:
    """transport -> the address format meta.proto's Endpoint comment gives for it."""
    proto = (REPO / "proto/kvstore/v1/meta.proto").read_text()
    comment = proto.split("// How a client reaches a segment", 1)[1].split("message Endpoint", 1)[0]
    return dict(re.findall(r'^//   (\w+)\s+"([^"]*)"', comment, re.M))


def test_proto_documents_every_transport_address():
    assert sorted(_proto_address_formats()) == sorted(registry.names())


def test_shm_address_is_what_the_proto_documents(tmp_path):
    """The shm endpoint a daemon offers splits into the proto's fields, in its order."""
    from kvstore.grant import GrantSigner
    from kvstore.storage.dram import DramSegment
    from kvstore.transport.base import GrantChecker
    from kvstore.transport.shm import ShmServer

    fields = _proto_address_formats()["shm"].split("|")
    assert fields == ["<host id>", "<daemon pid>", "<path of the segment file>"]
    segment = DramSegment("seg-doc", 1 << 20, str(tmp_path))
    try:
        server = ShmServer(GrantChecker(GrantSigner(b"s" * 16), {segment.segment_id: segment}.get), DaemonConfig())
        endpoint = server.endpoint(segment)
        assert endpoint is not None
        assert endpoint.address.split("|") == [host_id(), str(os.getpid()), str(segment.path)]
    finally:
        segment.close()


def test_every_command_is_documented():
    for name in [*COMMANDS, *ENGINE_COMMANDS]:
        assert f"`kvstore {name}" in DOCS, f"`kvstore {name}` is not in the docs (docs/operations.md)"


def test_every_config_field_is_documented():
    """Fields are documented by their flag's help (the comment on their line in kvstore/config/),
    and the docs name each config class and how a field maps to its env variable."""
    from kvstore.config.flags import field_help

    for cls in (MetaConfig, DaemonConfig, ClientConfig):
        assert cls.__name__ in DOCS and f"[{cls.SECTION}]" in DOCS
        helps = field_help(cls)
        undocumented = [f.name for f in dataclasses.fields(cls) if not helps.get(f.name)]
        assert not undocumented, f"{cls.__name__} fields without a comment (their --help text): {undocumented}"
