"""The backend's settings: the keys of --hicache-storage-backend-extra-config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from kvstore.config import META_ENV, TOKEN_ENV, load_config
from kvstore.errors import InvalidArgument

# Keys of the extra config that SGLang's dynamic loader reads itself.
SGLANG_KEYS = frozenset({"backend_name", "module_path", "class_name", "interface_v1"})


@dataclass(frozen=True)
class HiCacheConfig:
    SECTION: ClassVar[str] = "sglang"
    ENV: ClassVar[dict[str, str]] = {"meta": META_ENV, "token": TOKEN_ENV}

    meta: str = ""  # the kvstore metadata service
    tenant: str = "default"  # key namespace: tenants never share pages
    transports: tuple[str, ...] = ("shm", "mooncake", "ucx", "tcp")  # client transports, preferred first
    timeout_s: float = 10.0  # metadata calls and transfers
    token: str = field(default="", repr=False)  # bearer token ($KVSTORE_TOKEN; none: the token file)

    def __post_init__(self) -> None:
        if not self.meta:
            raise InvalidArgument(
                'set "meta" in --hicache-storage-backend-extra-config (or $KVSTORE_META) '
                "to the kvstore metadata service address"
            )

    @classmethod
    def from_extra(cls, extra: dict[str, Any]) -> HiCacheConfig:
        """The extra config's own keys, else $KVSTORE_SGLANG_<FIELD> ($KVSTORE_META for meta)."""
        try:
            return load_config(cls, None, None, **{k: v for k, v in extra.items() if k not in SGLANG_KEYS})
        except InvalidArgument as exc:
            raise InvalidArgument(f"kvstore HiCache backend: {exc}") from None
