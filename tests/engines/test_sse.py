"""SSE lines are split at \\n, \\r\\n and \\r only: a token's text may hold any other line break."""

import asyncio
import json

from kvstore.engines.serving import iter_sse, sse_lines

TEXTS = ["a\u2028b", "c\x85d", "e\u2029f", "plain"]
# As vLLM streams them: JSON with ensure_ascii off leaves U+2028, U+2029 and U+0085 unescaped.
STREAM = "".join(f"data: {json.dumps({'choices': [{'text': t}]}, ensure_ascii=False)}\n\n" for t in TEXTS)
STREAM += "data: [DONE]\r\n\r\n"


async def _chunks(data: str, size: int):
    for i in range(0, len(data), size):
        yield data[i : i + size]


def texts(size: int) -> list[str]:
    async def collect():
        return [e["choices"][0]["text"] async for e in iter_sse(sse_lines(_chunks(STREAM, size)))]

    return asyncio.run(collect())


def test_unicode_line_breaks_in_text_do_not_cut_an_event():
    assert "\u2028" in STREAM and len(STREAM.splitlines()) > len(STREAM.split("\n"))  # what httpx's aiter_lines cuts
    for size in (1, 3, 7, 4096):  # every way a chunk can end, \r\n split across two included
        assert texts(size) == TEXTS
