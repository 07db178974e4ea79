"""Prefill/decode disaggregation with the reference engine: a store, one prefill and one decode
instance, and the PD router; one prompt through the router, compared with a colocated run.

    python examples/pd_reference.py

The same processes by hand: `kvstore serve`, `kvstore engine --role prefill --meta M`,
`kvstore engine --role decode --meta M`, `kvstore route --prefill URL --decode URL --meta M`.
"""

import random
from typing import Any

import httpx

from kvstore.engines.launch import Fleet


def complete(url: str, tokens: list[int]) -> dict[str, Any]:
    resp = httpx.post(f"{url}/v1/completions", json={"prompt": tokens, "max_tokens": 8}, timeout=120)
    resp.raise_for_status()
    answer: dict[str, Any] = resp.json()
    return answer


def main() -> int:
    prompt = [random.Random(1).randrange(256) for _ in range(600)]
    with Fleet() as fleet:
        _, meta = fleet.store("256MiB")
        _, prefill = fleet.engine("prefill", meta)
        _, decode = fleet.engine("decode", meta)
        _, colocated = fleet.engine("colocated")
        _, router = fleet.router([prefill], [decode], [], meta, "--policy", "pd")
        local = complete(colocated, prompt)["choices"][0]["token_ids"]
        answer = complete(router, prompt)
        record = answer["kvstore"]
        tokens = answer["choices"][0]["token_ids"]
        print(f"route {record['route']}, KV moved {record.get('kv_load_bytes')} bytes, ttft {record['ttft_s']:.3f} s")
        print("decode with transferred KV gives the colocated tokens:", tokens == local)
        return 0 if tokens == local and record["route"] == "pd" else 1


if __name__ == "__main__":
    raise SystemExit(main())
