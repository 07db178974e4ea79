"""kvstore as an LMCache storage backend: a remote-storage plug-in LMCache loads by name.

LMCache (0.5.x) loads it without patching, through its `remote_storage_plugins` setting:

    remote_storage_plugins: ["kvstore"]
    extra_config:
      remote_storage_plugin.kvstore.module_path: kvstore.compat.lmcache.adapter
      remote_storage_plugin.kvstore.class_name: KVStoreConnectorAdapter
      kvstore.meta: 127.0.0.1:50051            # the metadata service (`kvstore serve` prints it)

or, without extra_config keys, `remote_url: kvstore://HOST:PORT` with the same module_path and
class_name. Chunks are stored under `lmcache/<LMCache's key>`, laid out as LMCache's own
Mooncake Store connector lays them out (connector.py).

LMCache's multi-process server (`lmcache server`) loads l2_adapter.KVStoreL2Adapter instead, as an
L2 adapter plug-in (docs/compat-lmcache.md):

    --l2-adapter '{"type": "plugin", "module_path": "kvstore.compat.lmcache.l2_adapter",
                   "class_name": "KVStoreL2Adapter", "adapter_params": {"meta": "HOST:PORT"}}'

Importing this package needs nothing of LMCache; of its modules, adapter, connector and
l2_adapter do.
"""
