"""Engine-side shims over the client: block keys and the KV block codec every shim uses, the
reference engine, the PD router, metrics, the demo and the capacity planner. See README.md."""
