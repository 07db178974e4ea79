"""Structured logs: one JSON object per line (`--log-format json`), notable events by name, and the
request id that follows one request through the router, the engines and the store's client.

`event(logger, "daemon_down", daemon_id=...)` logs a line whose message reads well as text and
whose JSON carries `event` and the fields as keys. `request_id` is a context variable: the
router sets it per request and sends it on as `X-Request-Id`; an engine sets it from that header,
and every line logged in that context (the client's transfer warnings included) carries it.
"""

from __future__ import annotations

import contextvars
import json
import logging
import time
from typing import Any

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("kvstore_request_id", default="")
REQUEST_ID_HEADER = "x-request-id"
_RESERVED = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def event(logger: logging.Logger, name: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log notable event `name` with `fields` (JSON-able values)."""
    text = " ".join(f"{k}={v}" for k, v in fields.items())
    logger.log(level, "%s %s", name, text, extra={"event": name, "fields": fields})


class JsonFormatter(logging.Formatter):
    """ts, level, logger, msg, request_id (when set), event and its fields, exc (when any)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = getattr(record, "request_id", "") or request_id.get()
        if rid:
            out["request_id"] = rid
        name = getattr(record, "event", None)
        if name:
            out["event"] = name
            fields = getattr(record, "fields", None) or {}
            out.update({k: v for k, v in fields.items() if k not in out})
        for key, value in vars(record).items():  # other `extra=` keys (rid: the text format's request_id)
            if key not in _RESERVED and key not in ("event", "fields", "request_id", "rid") and key not in out:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


class _RequestIdFilter(logging.Filter):
    """Adds ` [request_id]` to text lines logged while a request id is set."""

    def filter(self, record: logging.LogRecord) -> bool:
        rid = request_id.get()
        record.rid = f" [{rid}]" if rid else ""
        return True


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s%(rid)s: %(message)s"


def configure(level: str = "WARNING", fmt: str = "text") -> None:
    """Set up the root logger of a kvstore command: `fmt` is "text" or "json". Like
    logging.basicConfig, it leaves a root logger that someone else gave handlers alone (but for
    its level); a handler of an earlier configure() is replaced."""
    if fmt not in ("text", "json"):
        raise ValueError(f"log format {fmt!r}: use text or json")
    root = logging.getLogger()
    root.setLevel(level.upper())
    ours = [h for h in root.handlers if getattr(h, "kvstore", False)]
    if len(ours) < len(root.handlers):
        return
    for old in ours:
        root.removeHandler(old)
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(_RequestIdFilter())
    handler.kvstore = True  # type: ignore[attr-defined]  # marks the handler as configure()'s
    root.addHandler(handler)
