"""A storage daemon: its segments and transports (storage_daemon), its link to each metadata shard
(link) and the tier moves it runs (mover)."""
