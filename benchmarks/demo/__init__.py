"""The demo (`python -m benchmarks.demo`, or `kvstore demo` from a checkout): the store, the router
and reference engines (prefill, decode, colocated) under a workload; TTFT and TPOT for colocated,
PD and PD with injected failures. scenarios runs it, workload and loadgen make and send the load,
goodput judges it, plot draws it."""
