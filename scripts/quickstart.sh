#!/usr/bin/env bash
# Start `kvstore serve` (the embedded default), store a value, read it back, show the stats, stop.
set -euo pipefail
cd "$(dirname "$0")/.."
KV=.venv/bin/kvstore
log=$(mktemp)
ssd=$(mktemp -d)
$KV serve --port 0 --dram 256MiB --ssd-dir "$ssd" --ssd 512MiB >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$log" "$ssd"' EXIT
for _ in $(seq 300); do   # readiness: the server prints its address when it is serving
  grep -q "kvstore ready" "$log" && break
  kill -0 $pid 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.1
done
cat "$log"
meta=$(sed -n 's/.*kvstore ready: meta=\([0-9.:]*\).*/\1/p' "$log")
echo
echo "\$ kvstore put --meta $meta greeting 'hello from kvstore'"
$KV put --meta "$meta" greeting "hello from kvstore"
echo "\$ kvstore get --meta $meta greeting"
$KV get --meta "$meta" greeting; echo
echo "\$ kvstore get --meta $meta --transports tcp greeting"
$KV get --meta "$meta" --transports tcp greeting; echo
echo "\$ kvstore stat --meta $meta greeting"
$KV stat --meta "$meta" greeting
