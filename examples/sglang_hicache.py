"""kvstore as SGLang's HiCache storage tier: the calls SGLang makes on the backend, against a
store, with a small host KV pool standing in for SGLang's (SGLang itself needs CUDA).

    python examples/sglang_hicache.py [--meta HOST:PORT]

With SGLang installed, the backend is loaded by SGLang itself:

    python -m sglang.launch_server --model-path MODEL --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic --hicache-storage-backend-extra-config \\
        '{"backend_name": "kvstore", "module_path": "kvstore.engines.sglang",
          "class_name": "KVStoreHiCacheStorage", "interface_v1": 1, "meta": "127.0.0.1:50051"}'
"""

import argparse
import types

import torch

from kvstore.engines.sglang import KVStoreHiCacheStorage


class HostPool:
    """The part of SGLang's host KV pool the backend uses: pages of one [2, tokens, width] buffer."""

    def __init__(self, pages: int = 8, page_size: int = 16, width: int = 64) -> None:
        self.page_size, self.dtype, self.layout = page_size, torch.float16, "page_first"
        self.kv_buffer = torch.zeros(2, pages * page_size, width, dtype=self.dtype)

    def get_page_buffer_meta(self, indices: torch.Tensor) -> tuple[list[int], list[int]]:
        """Per page: the address and size of its K region and of its V region."""
        ptrs, sizes = [], []
        for start in indices[:: self.page_size].tolist():
            for kv in (0, 1):
                region = self.kv_buffer[kv, start : start + self.page_size]
                ptrs.append(region.data_ptr())
                sizes.append(region.numel() * region.element_size())
        return ptrs, sizes


def run(meta: str) -> None:
    config = types.SimpleNamespace(tp_rank=0, tp_size=1, model_name="demo/model",
                                   extra_config={"interface_v1": 1, "meta": meta})  # fmt: skip
    src, dst = HostPool(), HostPool()
    src.kv_buffer.normal_()
    writer, reader = KVStoreHiCacheStorage(config, {}), KVStoreHiCacheStorage(config, {})
    writer.register_mem_pool_host(src)
    reader.register_mem_pool_host(dst)
    pages = ["hash-page-0", "hash-page-1"]  # SGLang's chained page hashes
    print("stored:", writer.batch_set_v1(pages, torch.arange(0, 32)))
    print("leading pages stored:", reader.batch_exists([*pages, "hash-page-2"]))
    print("loaded:", reader.batch_get_v1(pages, torch.arange(32, 64)))
    print("same bytes:", torch.equal(dst.kv_buffer[:, 32:64], src.kv_buffer[:, 0:32]))
    writer.close()
    reader.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--meta", help="a running store's metadata address")
    args = parser.parse_args()
    if args.meta:
        run(args.meta)
    else:
        from kvstore.engines.launch import Fleet

        with Fleet() as fleet:
            _, meta = fleet.store("64MiB")
            run(meta)
