"""kvstore as an LMCache storage backend: a remote-storage plug-in LMCache loads by name.

LMCache (0.5.x) loads it without patching, through its `remote_storage_plugins` setting:

    remote_storage_plugins: ["kvstore"]
    extra_config:
      remote_storage_plugin.kvstore.module_path: kvstore.compat.lmcache.adapter
      remote_storage_plugin.kvstore.class_name: KVStoreConnectorAdapter
      kvstore.meta: 127.0.0.1:50051            # the metadata service (`kvstore serve` prints it)

or, without extra_config keys, `remote_url: kvstore://HOST:PORT` with the same module_path and
class_name. Chunks are stored under `lmcache/<LMCache's key>`, laid out as LMCache's own
Mooncake Store connector lays them out (connector.py). Importing this package needs nothing of
LMCache; its modules do.
"""
