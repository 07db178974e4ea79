"""Regenerate kvstore/v1/*_pb2*.py (and .pyi stubs) from proto/kvstore/v1/*.proto (run: python scripts/gen_proto.py)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def generate(out_dir: Path) -> list[Path]:
    """Run protoc on every .proto under proto/, writing Python modules below out_dir."""
    from grpc_tools import protoc

    protos = sorted(str(p.relative_to(ROOT / "proto")) for p in (ROOT / "proto").rglob("*.proto"))
    # Typed stubs for the messages and the gRPC stubs come from mypy-protobuf's plugins.
    bin_dir = Path(sys.executable).parent
    args = [
        "protoc",
        f"-I{ROOT / 'proto'}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {protos}")
    return sorted(p for p in (out_dir / "kvstore" / "v1").glob("*_pb2*") if p.suffix in (".py", ".pyi"))


if __name__ == "__main__":
    written = generate(ROOT)
    print("\n".join(str(p.relative_to(ROOT)) for p in written))
    sys.exit(0)
