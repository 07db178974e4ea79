"""The indexer's HTTP face, in the conventions of Mooncake's KV indexer API (Conductor):

    POST /register        consume a vLLM-format KV event publisher (an engine)   operator's token
    POST /unregister      stop consuming it                                     operator's token
    POST /query           token ids -> the longest cached prefix, in tokens, per instance and medium
    POST /query_by_hash   the same from kvstore rolling hashes

The store itself answers as the instance "kvstore" (its DRAM is CPU, its SSD DISK, its GPU tier
GPU); each registered engine answers as its instance_id. Bad input is a 400 with the reason.
docs/indexer.md has the fields and how they map to kvstore's keys.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from kvstore import blockhash
from kvstore.admin.http import AdminServer, Response
from kvstore.indexer import media
from kvstore.indexer.engine_cache import ENGINE_SEED
from kvstore.indexer.registry import Registration, Registry
from kvstore.indexer.store_table import StoreTable
from kvstore.indexer.table import Match

STORE_INSTANCE = "kvstore"
DEFAULT_TENANT = "default"
REPORTED = (media.GPU, media.CPU, media.DISK)


class IndexerApi:
    def __init__(self, store: StoreTable | None, registry: Registry | None = None) -> None:
        self.store = store
        self.registry = registry or Registry()

    def mount(self, admin: AdminServer) -> None:
        """Registration makes the service dial the endpoint it is given: the operator's call
        (guarded); the queries only read, and stay open on the admin face."""
        routes: dict[str, tuple[Callable[[dict[str, Any]], Any], bool]] = {
            "/register": (self.register, True),
            "/unregister": (self.unregister, True),
            "/query": (self.query, False),
            "/query_by_hash": (self.query_by_hash, False),
        }
        for path, (handler, guarded) in routes.items():
            admin.route("POST", path, _json_handler(handler), guarded=guarded)

    def close(self) -> None:
        self.registry.close()

    # -- registration --------------------------------------------------------------------------

    def register(self, body: dict[str, Any]) -> dict[str, Any]:
        registration = Registration(
            endpoint=_text(body, "endpoint"),
            instance_id=_text(body, "instance_id"),
            model=_text(body, "modelname", alias="model"),
            block_size=_positive(body, "block_size"),
            dp_rank=_natural(body, "dp_rank", default=0),
            tenant_id=_text(body, "tenant_id", default=DEFAULT_TENANT),
            replay_endpoint=_text(body, "replay_endpoint", default="") or None,
            kind=_text(body, "type", default="vLLM"),
            lora_name=_text(body, "lora_name", default=""),
            salt=_text(body, "additionalsalt", alias="additional_salt", default=""),
        )
        if registration.instance_id == STORE_INSTANCE:
            raise ValueError(f"instance_id {STORE_INSTANCE!r} is the store's own: choose another")
        self.registry.register(registration)
        return {"status": "registered successfully", "instance_id": registration.instance_id}

    def unregister(self, body: dict[str, Any]) -> dict[str, Any]:
        rank = body.get("dp_rank")
        removed = self.registry.unregister(
            _text(body, "instance_id"),
            _text(body, "tenant_id", default=DEFAULT_TENANT),
            None if rank is None else _natural(body, "dp_rank"),
        )
        if not removed:
            raise LookupError("no such registered instance")
        return {"status": "unregistered successfully", "removed_instances": removed}

    # -- queries -------------------------------------------------------------------------------

    def query(self, body: dict[str, Any]) -> dict[str, Any]:
        tokens = _ints(body, "token_ids")
        block_size = _positive(body, "block_size")
        extra = blockhash.extra_key(_text(body, "lora_name", default=""), _text(body, "cache_salt", default=""))
        seed = _int(body, "seed", default=0)
        engine_chain = [blockhash.short(d) for d in blockhash.chain(tokens, block_size, ENGINE_SEED, extra)]
        store_chain = (
            engine_chain
            if seed == ENGINE_SEED
            else [blockhash.short(d) for d in blockhash.chain(tokens, block_size, seed, extra)]
        )
        return self._answer(body, block_size, store_chain, engine_chain)

    def query_by_hash(self, body: dict[str, Any]) -> dict[str, Any]:
        name = "seq_hashes" if "seq_hashes" in body else "block_hash"
        hashes = _ints(body, name)
        if any(not 0 <= h < 1 << 64 for h in hashes):
            raise ValueError(f"{name} are unsigned 64-bit integers")
        return self._answer(body, _positive(body, "block_size"), hashes, hashes)

    def _answer(
        self, body: dict[str, Any], block_size: int, store_chain: Sequence[int], engine_chain: Sequence[int]
    ) -> dict[str, Any]:
        model = _text(body, "model", alias="modelname")
        tenant = _text(body, "tenant_id", default=DEFAULT_TENANT)
        instance = _text(body, "instance_id", default="") or None
        out: dict[str, Any] = {}
        if self.store is not None and instance in (None, STORE_INSTANCE):
            layout = _text(body, "layout", default="") or None
            found = self.store.match(tenant, model, store_chain, layout)
            out[STORE_INSTANCE] = _entry(found, block_size, {})
        ranks: dict[str, dict[int, Match]] = {}
        for engine in self.registry.engines(tenant, model, instance):
            reg = engine.registration
            if reg.block_size == block_size:
                ranks.setdefault(reg.instance_id, {})[reg.dp_rank] = engine.cache.match(engine_chain)
            else:
                ranks.setdefault(reg.instance_id, {})
        for instance_id, by_rank in ranks.items():
            out[instance_id] = _merge(by_rank, block_size)
        return {tenant: out}


def _entry(found: Match, block_size: int, dp: dict[str, int]) -> dict[str, Any]:
    entry: dict[str, Any] = {"longest_matched": found.blocks * block_size}
    for name in REPORTED:
        entry[name] = found.by_medium.get(name, 0) * block_size
    for name, blocks in found.by_medium.items():
        entry.setdefault(name, blocks * block_size)
    entry["DP"] = dp
    return entry


def _merge(by_rank: dict[int, Match], block_size: int) -> dict[str, Any]:
    """One instance's answer over its dp ranks: the best rank in each medium."""
    best = Match.none()
    by_medium: dict[str, int] = {}
    for found in by_rank.values():
        if found.better(best):
            best = found
        for name, blocks in found.by_medium.items():
            by_medium[name] = max(by_medium.get(name, 0), blocks)
    dp = {str(rank): found.blocks * block_size for rank, found in sorted(by_rank.items())}
    return _entry(Match(best.blocks, by_medium), block_size, dp)


# -- request parsing ---------------------------------------------------------------------------


def _json_handler(handler: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, list[str]], bytes], Response]:
    def serve(query: dict[str, list[str]], body: bytes) -> Response:
        try:
            parsed = json.loads(body or b"{}")
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"the body must be a JSON object: {exc}") from exc
        if not isinstance(parsed, dict):
            raise ValueError("the body must be a JSON object")
        try:
            return Response.json(handler(parsed))
        except LookupError as exc:
            return Response.json({"error": str(exc.args[0] if exc.args else exc)}, 404)

    return serve


def _field(body: dict[str, Any], name: str, alias: str | None) -> Any:
    if name in body:
        return body[name]
    return body.get(alias) if alias is not None else None


_REQUIRED = object()


def _text(body: dict[str, Any], name: str, default: Any = _REQUIRED, alias: str | None = None) -> str:
    value = _field(body, name, alias)
    if value is None:
        if default is _REQUIRED:
            raise ValueError(f"{name!r} is required")
        return str(default)
    if not isinstance(value, str):
        raise ValueError(f"{name!r} must be a string, got {type(value).__name__}")
    return value


def _int(body: dict[str, Any], name: str, default: Any = _REQUIRED) -> int:
    value = body.get(name)
    if value is None:
        if default is _REQUIRED:
            raise ValueError(f"{name!r} is required")
        return int(default)
    if type(value) is not int:
        raise ValueError(f"{name!r} must be an integer, got {value!r}")
    return value


def _positive(body: dict[str, Any], name: str) -> int:
    value = _int(body, name)
    if value <= 0:
        raise ValueError(f"{name!r} must be positive, got {value}")
    return value


def _natural(body: dict[str, Any], name: str, default: Any = _REQUIRED) -> int:
    value = _int(body, name, default)
    if value < 0:
        raise ValueError(f"{name!r} must not be negative, got {value}")
    return value


def _ints(body: dict[str, Any], name: str) -> list[int]:
    value = body.get(name)
    if not isinstance(value, list) or any(type(v) is not int for v in value):
        raise ValueError(f"{name!r} must be a list of integers")
    return value
