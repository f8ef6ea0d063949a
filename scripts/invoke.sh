#!/usr/bin/env bash
# make invoke: the worker under `cargo lambda watch` (cargo-lambda from PyPI), against the local
# emulator, invoked with a sample event: EVENT=events/sqs-mixed-batch.json make invoke
set -euo pipefail
cd "$(dirname "$0")/.."
event=${EVENT:-events/sqs-one-job.json}
scripts/emulator.sh install
if ! .venv/bin/python -c "import importlib.metadata as m; m.version('cargo-lambda')" >/dev/null 2>&1; then
  .venv/bin/pip install --quiet --disable-pip-version-check -r scripts/requirements-build.txt
fi
# `cargo lambda watch` runs the function with `cargo run`, and an invocation's deadline starts
# when it is requested: build first, so the deadline is not spent compiling.
cargo build --quiet --bin worker
run() {
  export PATH="$PWD/.venv/bin:$PATH"
  suffix=$(date +%s)
  eval "$(scripts/emulator.sh create "jobs-invoke-$suffix" "jobs-invoke-$suffix")"
  port=$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  cargo lambda watch --quiet --invoke-port "$port" --timeout 120 \
    --env-var "JOBS_TABLE=$JOBS_TABLE" --env-var "AWS_ENDPOINT_URL=$AWS_ENDPOINT_URL" \
    --env-var "AWS_ACCESS_KEY_ID=$AWS_ACCESS_KEY_ID" --env-var "AWS_SECRET_ACCESS_KEY=$AWS_SECRET_ACCESS_KEY" \
    --env-var "AWS_REGION=$AWS_REGION" --env-var "RUST_LOG=${RUST_LOG:-info}" > .emulator/watch.log 2>&1 &
  watch=$!
  trap 'kill $watch 2>/dev/null || true' EXIT
  for _ in $(seq 1 600); do
    if .venv/bin/python -c "import socket; socket.create_connection(('127.0.0.1', $port), 1)" 2>/dev/null; then break; fi
    sleep 0.5
  done
  echo "invoking worker with $event (table $JOBS_TABLE)"
  cargo lambda invoke worker --invoke-port "$port" --data-file "$event"
  echo
}
export -f run
export event
scripts/with-emulator.sh bash -c run
