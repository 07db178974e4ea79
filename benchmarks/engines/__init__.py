"""Engine-side measures: the KV load path against recomputing (kv_load) and TTFT on a device (ttft)."""
