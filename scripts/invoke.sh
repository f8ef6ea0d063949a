#!/usr/bin/env bash
# make invoke: the functions under cargo-lambda's Lambda runtime emulator (cargo-lambda from
# PyPI), against the local AWS emulator, with sample events; prints each answer.
#
#   make invoke                                   events/sqs-one-job.json
#   EVENT=events/sqs-mixed-batch.json make invoke one event
#   scripts/invoke.sh events/*.json               several, one runtime emulator for all
#   scripts/invoke.sh --check events/*.json       and compare each answer with events/README.md
#
# Each run makes its own table, DLQ, bucket and event bus (so its answers do not depend on an
# earlier run), and the queues `jobs` and `jobs.fifo` that the sample events name.
set -euo pipefail
cd "$(dirname "$0")/.."
args=("$@")
if [ ${#args[@]} -eq 0 ]; then args=("${EVENT:-events/sqs-one-job.json}"); fi
scripts/emulator.sh install-build
# The binaries `cargo test` builds, which `make test` has then built already: cargo builds the
# bins for the tests with the test-only features turned on (tokio's test clock, the crate's
# test support, neither called by the functions), and a plain `cargo build` would compile the
# whole dependency tree a second time without them (over two minutes here). WORKER_BIN and
# DISPATCHER_BIN name other binaries (a `cargo build` of your own, say).
if [ -z "${WORKER_BIN:-}" ] || [ -z "${DISPATCHER_BIN:-}" ]; then
  cargo test --no-run --test emulator
fi
run() {
  export PATH="$PWD/.venv/bin:$PATH"
  suffix="$(date +%s)-$$"
  eval "$(scripts/emulator.sh create "jobs-invoke-$suffix" "jobs-invoke-$suffix" --also-queue jobs --also-queue jobs.fifo)"
  .venv/bin/python scripts/invoke.py "$@"
}
export -f run
scripts/with-emulator.sh bash -c 'run "$@"' run "${args[@]}"
