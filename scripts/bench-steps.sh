#!/usr/bin/env bash
# The benchmark steps; run by scripts/bench.sh with the emulator up. Each step's output goes to
# the terminal and to OUT_DIR (target/bench), from which BENCHMARKS.md is written.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/bench}
mkdir -p "$out"
step() { # step NAME COMMAND...: runs a step, its output kept as OUT_DIR/NAME.txt
  local name=$1
  shift
  echo
  echo "\$ $*"
  "$@" | tee "$out/$name.txt"
}

step heartbeat target/release/examples/bench_heartbeat
step batch target/release/examples/bench_batch
step cost target/release/examples/bench_cost
step chaos target/release/examples/chaos --seed 1 --jobs 10000
step chaos-webhooks target/release/examples/chaos --seed 2 --jobs 10000
step mixed target/release/examples/chaos --mixed --seed 1 --jobs 10000
step scale target/release/examples/chaos --scale --seed 1 --jobs 100000 --series "$out/scale-series.json"
step tenants target/release/examples/chaos --tenants --seed 1
step producers target/release/examples/chaos --producers --seed 1
step urgent target/release/examples/chaos --urgent --seed 1
DRILL_TIMELINE="$out/drill.json" step drill cargo test --quiet --test emulator drill -- --nocapture

echo
echo "peak memory: one 10,000-record batch through the SDK"
/usr/bin/time -v target/release/examples/bench_batch peak 10000 2> "$out/peak.txt" >/dev/null
{
  echo "one 10,000-record batch through the SDK (bench_batch peak 10000):"
  grep -E "Maximum resident set size|Elapsed" "$out/peak.txt"
} | tee "$out/memory.txt"

# heavy NAME MODE TITLE: the release worker at 128 MB takes one event of bench_payloads.py's MODE
# against a mock Runtime API; its peak resident memory goes to memory.txt.
heavy() {
  local name=$1 mode=$2 title=$3
  echo
  echo "peak memory: $title, target/release/worker at 128 MB"
  (
    eval "$(scripts/emulator.sh create "jobs-$name-$$" "jobs-$name-$$")"
    .venv/bin/python scripts/bench_payloads.py "$mode" "/tmp/fenced-jobs-$name-event.json"
    port=$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    .venv/bin/python scripts/mock_runtime_api.py "$port" "/tmp/fenced-jobs-$name-event.json" &
    mock=$!
    sleep 0.5
    AWS_LAMBDA_RUNTIME_API="127.0.0.1:$port" AWS_LAMBDA_FUNCTION_NAME=worker \
      AWS_LAMBDA_FUNCTION_VERSION='$LATEST' AWS_LAMBDA_FUNCTION_MEMORY_SIZE=128 PROVIDER=simulated \
      PAYLOAD_BUCKET="$RESULTS_BUCKET-producer" \
      RUST_LOG=warn /usr/bin/time -v target/release/worker > /dev/null 2> "$out/$name.txt" || true
    kill $mock 2>/dev/null || true
    {
      echo
      echo "$title, the release worker at 128 MB:"
      grep -E "Maximum resident set size|Elapsed" "$out/$name.txt"
    } | tee -a "$out/memory.txt"
  )
}
heavy heavy pointers "ten Extended Client pointers to 8 MiB payloads"
heavy costly costly "the worst valid batch: ten bodies each just under the 32 MiB parse cost"

echo
echo "sizes"
{
  ls -l target/release/worker | awk '{print "x86_64 release binary: " $5 " bytes"}'
  if [ -f target/lambda/worker/bootstrap.zip ]; then
    ls -l target/lambda/worker/bootstrap.zip | awk '{print "arm64 deployable zip (make build): " $5 " bytes"}'
  else
    echo "arm64 deployable zip: not built (make build before make bench)"
  fi
} | tee "$out/sizes.txt"

echo
echo "cold start: hyperfine over target/release/worker against a mock Runtime API"
command -v hyperfine >/dev/null || { echo "hyperfine is not installed (apt-get install hyperfine)" | tee "$out/cold.txt"; exit 0; }
eval "$(scripts/emulator.sh create "jobs-cold-$$" "jobs-cold-$$")"
port=$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# The sample one-job event without its simulated latency: the first run claims and accepts the
# job, every later run finds it finished (one DynamoDB call), as a redelivery would.
.venv/bin/python -c "
import json
e = json.load(open('events/sqs-one-job.json'))
body = json.loads(e['Records'][0]['body'])
body['input'].pop('simulate', None)
e['Records'][0]['body'] = json.dumps(body)
json.dump(e, open('/tmp/fenced-jobs-cold-event.json', 'w'))
"
.venv/bin/python scripts/mock_runtime_api.py "$port" /tmp/fenced-jobs-cold-event.json &
mock=$!
trap 'kill $mock 2>/dev/null || true' EXIT
sleep 0.5
export AWS_LAMBDA_RUNTIME_API="127.0.0.1:$port" AWS_LAMBDA_FUNCTION_NAME=worker \
  AWS_LAMBDA_FUNCTION_VERSION='$LATEST' AWS_LAMBDA_FUNCTION_MEMORY_SIZE=128 \
  AWS_LAMBDA_LOG_STREAM_NAME=bench AWS_LAMBDA_LOG_GROUP_NAME=bench RUST_LOG=warn
# The same runs with tracing on: spans to a local OTLP sink, as to a collector layer, flushed by
# the end of each invocation (the first command stays the row's figure; the second its own).
sink_port=$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
.venv/bin/python scripts/otlp_sink.py "$sink_port" &
sink=$!
trap 'kill $mock $sink 2>/dev/null || true' EXIT
sleep 0.5
traced="env OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$sink_port target/release/worker"
hyperfine -N --warmup 3 --runs 30 -i --export-json "$out/cold.json" --output=null \
  -n "no tracing" target/release/worker -n "tracing on" "$traced" | tee "$out/cold.txt"
{
  echo
  echo "peak memory of one invocation, no tracing and tracing on:"
  # Each run exits when the mock Runtime API closes its connection (not 0): only its peak counts.
  echo "no tracing: $( (/usr/bin/time -v target/release/worker 2>&1 >/dev/null || true) | grep "Maximum resident")"
  echo "tracing on: $( (/usr/bin/time -v $traced 2>&1 >/dev/null || true) | grep "Maximum resident")"
} | tee -a "$out/cold.txt"
