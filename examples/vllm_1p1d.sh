#!/usr/bin/env bash
# vLLM 1P1D through kvstore: the store, a prefill and a decode vLLM instance with kvstore's
# connector, and the PD router in front; one completion through the router; what moved.
#   MODEL=/path/to/model bash examples/vllm_1p1d.sh
# Needs vLLM (scripts/install_vllm.sh installs its CPU build). Every process it starts is stopped
# at exit. VLLM_ARGS adds flags to both vLLM instances (e.g. "--dtype float32 --block-size 32").
set -euo pipefail
: "${MODEL:?set MODEL to a local model directory or name}"
PY=${PYTHON:-python}
KV_CACHE_BYTES=${KV_CACHE_BYTES:-1073741824}   # each instance's KV cache in CPU memory: size it to the machine
free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PREFILL_PORT=${PREFILL_PORT:-$(free_port)}
DECODE_PORT=${DECODE_PORT:-$(free_port)}
ROUTER_PORT=${ROUTER_PORT:-$(free_port)}
logs=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$logs"' EXIT

wait_for() {   # wait_for LOG PATTERN PID: until the process prints its readiness line
  until grep -q "$2" "$1"; do
    kill -0 "$3" 2>/dev/null || { echo "--- $1"; tail -50 "$1"; exit 1; }
    sleep 0.5
  done
}

# The store: a metadata service and one storage daemon (port 0: any free port).
"$PY" -m kvstore serve --port 0 --dram 512MiB >"$logs/store.log" 2>&1 & pids+=($!)
wait_for "$logs/store.log" "kvstore ready" "${pids[-1]}"
META=$(sed -n 's/.*kvstore ready: meta=\([0-9.:]*\).*/\1/p' "$logs/store.log")
echo "store: $META"

vllm() {   # vllm PORT ROLE
  local kv="{\"kv_connector\": \"KVStoreConnector\", \"kv_connector_module_path\": \"kvstore.engines.vllm\",
    \"kv_role\": \"$2\", \"kv_load_failure_policy\": \"recompute\", \"kv_connector_extra_config\": {\"meta\": \"$META\"}}"
  # shellcheck disable=SC2086
  "$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL" --host 127.0.0.1 --port "$1" \
    --kv-cache-memory-bytes "$KV_CACHE_BYTES" ${VLLM_ARGS:-} --kv-transfer-config "$kv" >"$logs/$2.log" 2>&1 &
  pids+=($!)
}
vllm "$PREFILL_PORT" kv_producer
vllm "$DECODE_PORT" kv_consumer

# The router waits for both instances (about a minute on a CPU), then prints its readiness line.
"$PY" -m kvstore route --backend vllm --prefill "http://127.0.0.1:$PREFILL_PORT" \
  --decode "http://127.0.0.1:$DECODE_PORT" --policy pd --port "$ROUTER_PORT" --wait-for-instances 600 \
  >"$logs/router.log" 2>&1 & pids+=($!)
wait_for "$logs/router.log" "kvstore ready" "${pids[-1]}"
echo "router: http://127.0.0.1:$ROUTER_PORT (prefill :$PREFILL_PORT, decode :$DECODE_PORT)"

prompt=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' $(seq 40))
curl -sf "http://127.0.0.1:$ROUTER_PORT/v1/completions" -H 'Content-Type: application/json' \
  -d "{\"prompt\": \"$prompt\", \"max_tokens\": 16, \"temperature\": 0}" >"$logs/answer.json"
"$PY" -c 'import json, sys; a = json.load(open(sys.argv[1])); print("text:", repr(a["choices"][0]["text"])); print("route:", a.get("kvstore", {}).get("route"))' "$logs/answer.json"

# What happened: blocks the decode instance loaded from kvstore, requests per route at the router.
curl -s "http://127.0.0.1:$DECODE_PORT/metrics" | grep '^vllm:kvstore_load_blocks_total' || true
curl -s "http://127.0.0.1:$ROUTER_PORT/metrics" | grep '^kvstore_router_requests_total' || true
