"""The repository's benchmark lab: kvstore measured beside other stores, and single mechanisms
measured on their own. Run from the root of a checkout as `python -m benchmarks.<name>` (the
current directory is then on sys.path). Not part of the kvstore package: the wheel holds kvstore/
only, whose `kvstore bench` measures the store itself against its ceilings.

    compare        `kvstore bench` with peer stores beside kvstore, and the kvstore / peer ratios
    peers          the peer stores (Mooncake Store, Redis): the plug-in `kvstore bench --compare` loads
    failover       seconds from a killed metadata leader to its standby's first put (docs/ha.md)
    takeover       a service taking over: restoring a segment's blocks from the journal's records
    keyscale       what a metadata call costs as the store grows
    sharding       sharded metadata: CPU per call and calls/s per shard count (docs/sharding.md)
    security_cost  what TLS, tokens and tenants cost (docs/security.md)
    metrics_cost   what the metrics cost (docs/observability.md)
    demo           `kvstore demo`: the store, the router and reference engines under a workload
    engines        the engines' KV load path against recomputing (kv_load); TTFT on a device (ttft);
                   kvstore as vLLM's offloading tier (tier; tiering drives vLLM's manager)
    fleet          hosts in network namespaces with shaped links and partitions (tests/fleet, docs/fleet.md)
    router_sim     the router's policies replayed on simulated instances, with no machine noise
"""
