"""Engines take a tenant's token from $KVSTORE_TOKEN, store their KV in that tenant's namespace,
and never put the token in a log line or a metric."""

from __future__ import annotations

import random

import httpx
import pytest

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.engines.launch import Fleet
from kvstore.metaclient.client import MetaClient
from kvstore.results import TenantInfo
from kvstore.wire.calls import TenantAdd, TenantToken

pytestmark = pytest.mark.slow


def test_a_pd_pair_with_a_tenant_token_keeps_its_kv_in_its_namespace_and_the_token_out_of_logs():
    with Fleet() as fleet:
        _, meta = fleet.store("256MiB")
        with MetaClient(meta) as admin:
            admin.call(TenantAdd(TenantInfo("serving")))
            _, token = admin.call(TenantToken("serving"))
        env = {"KVSTORE_TOKEN": token}
        prefill_proc, prefill = fleet.engine("prefill", meta, env=env)
        decode_proc, decode = fleet.engine("decode", meta, env=env)
        router_proc, router = fleet.router([prefill], [decode], [], meta, "--policy", "pd", env=env)
        rng = random.Random(3)
        body = {"prompt": [rng.randrange(256) for _ in range(300)], "max_tokens": 4}
        reply = httpx.post(f"{router}/v1/completions", json=body, timeout=120).json()
        assert reply["kvstore"]["route"] == "pd" and reply["kvstore"]["fallback"] is None, reply["kvstore"]
        with KVClient(meta, ClientConfig(token=token)) as tenant, KVClient(meta) as operator:
            assert tenant.stats().keys > 0  # the KV the prefill instance saved is the tenant's
            assert operator.list_keys().keys == ()  # and none of it is the default tenant's
        scraped = "".join(httpx.get(f"{url}/metrics").text for url in (prefill, decode, router))
        logged = "".join(line for proc in (prefill_proc, decode_proc, router_proc) for line in proc.lines)
        assert token not in scraped and token not in logged
