"""Other stores' client APIs spoken over kvstore, so their users switch (or mix) without rewrites.

    kvstore.compat.mooncake   Mooncake Store's Python class, `MooncakeDistributedStore`, with its
                              return codes; `python -m kvstore.compat.mooncake.run` runs code that
                              imports `mooncake.store` against kvstore
    kvstore.compat.lmcache    kvstore as an LMCache remote storage plug-in

Everything here uses only the client SDK (kvstore.client), kvstore.errors and kvstore.config.
"""
