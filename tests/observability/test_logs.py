"""Structured logs of real processes: with --log-format json every line is one JSON object; the
service logs daemon up, eviction pressure and daemon down as events; one request's id is on the
router's and the engine's lines alike."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.engines.launch import Fleet
from kvstore.jsonlog import JsonFormatter, event, request_id
from tests.cluster import Cluster, spawn, wait_until

MIB = 1 << 20


def records(lines: list[str]) -> list[dict[str, Any]]:
    """Every line but the readiness line, each parsed as JSON (a line that is not fails the test)."""
    return [json.loads(line) for line in lines if line.strip() and not line.startswith("kvstore ")]


def events(lines: list[str], name: str) -> list[dict[str, Any]]:
    return [r for r in records(lines) if r.get("event") == name]


def test_the_formatter_writes_one_object_per_record_with_the_request_id():
    record = logging.LogRecord("kvstore.x", logging.WARNING, __file__, 1, "moved %d", (3,), None)
    record.event, record.fields = "fallback", {"reason": "deadline"}
    token = request_id.set("cmpl-1")
    try:
        out = json.loads(JsonFormatter().format(record))
    finally:
        request_id.reset(token)
    assert out["msg"] == "moved 3" and out["level"] == "warning" and out["logger"] == "kvstore.x"
    assert out["event"] == "fallback" and out["reason"] == "deadline" and out["request_id"] == "cmpl-1"


def test_event_reads_as_text_too(caplog):
    with caplog.at_level(logging.INFO):
        event(logging.getLogger("kvstore.t"), "daemon_up", daemon_id="d1")
    assert caplog.records[-1].getMessage() == "daemon_up daemon_id=d1"


@pytest.mark.slow
def test_daemon_up_eviction_pressure_and_daemon_down_are_json_events():
    cluster = Cluster()
    try:
        fast = {"KVSTORE_META_HEARTBEAT_TTL_S": "1", "KVSTORE_META_TICK_INTERVAL_S": "0.2"}
        meta_proc = spawn(["--log-level", "INFO", "--log-format", "json", "meta", "--port", "0"], fast)
        cluster.procs.append(meta_proc)
        meta = meta_proc.ready_line.split("meta=")[1].split()[0]
        daemon = cluster.daemon(meta, "8MiB", {"KVSTORE_DAEMON_HEARTBEAT_INTERVAL_S": "0.2"})
        up = wait_until(lambda: events(meta_proc.lines, "daemon_up"), what="daemon_up")
        with KVClient(meta, ClientConfig(transports=("tcp",))) as kv:
            for i in range(12):  # 12 MiB into 8: evictions
                kv.put(f"log/{i}", bytes([i]) * MIB)
        pressure = wait_until(lambda: events(meta_proc.lines, "eviction_pressure"), what="eviction_pressure")
        daemon.kill()
        down = wait_until(lambda: events(meta_proc.lines, "daemon_down"), what="daemon_down")
        assert up[0]["daemon_id"] == down[0]["daemon_id"] and up[0]["level"] == "info"
        assert down[0]["level"] == "warning"
        assert pressure[0]["evicted"] > 0 and 0 < pressure[0]["dram_fill"] <= 1
        assert all({"ts", "level", "logger", "msg"} <= r.keys() and "rid" not in r for r in records(meta_proc.lines))
    finally:
        cluster.close()


@pytest.mark.slow
def test_one_request_id_on_the_router_and_the_engine():
    with Fleet() as fleet:
        logs = ("--log-level", "INFO", "--log-format", "json")
        engine, colocated = fleet.engine("colocated", None, *logs)
        router, url = fleet.router([], [], [colocated], None, *logs)
        answer = httpx.post(f"{url}/v1/completions", json={"prompt": "hello there", "max_tokens": 3}, timeout=120)
        answer.raise_for_status()
        rid = answer.json()["id"]

        # Both processes log a request's line once it has ended, which can be after its answer reached us.
        def summary_lines(lines: list[str]) -> list[dict[str, Any]]:
            return [r for r in records(lines) if r.get("request_id") == rid and r["msg"].startswith("request {")]

        wait_until(lambda: summary_lines(engine.lines), what="the engine's line")
        wait_until(lambda: summary_lines(router.lines), what="the router's line")
        on_router = [r for r in records(router.lines) if r.get("request_id") == rid]
        on_engine = [r for r in records(engine.lines) if r.get("request_id") == rid]
        assert any("request" in r["msg"] for r in on_router)
        (line,) = [json.loads(r["msg"].split(" ", 1)[1]) for r in on_router if r["msg"].startswith("request {")]
        assert line["request_id"] == rid and set(line["ttft_phases"]) == {
            "queue",
            "prefill",
            "batch",
            "kv_put",
            "kv_get",
            "first_step",
            "other",
        }
        assert sum(line["ttft_phases"].values()) >= line["ttft_s"] * 0.99
        assert any(json.loads(r["msg"].split(" ", 1)[1])["request_id"] == rid for r in on_engine)
