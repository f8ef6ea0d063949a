#!/usr/bin/env bash
# make bench: release builds, then every benchmark with the emulator up; prints markdown.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "machine: $(nproc) cores, $(uname -m), $(date -u +%Y-%m-%d)"
cargo build --release --quiet --bin worker --example bench_heartbeat --example bench_batch --example bench_cost
# moto behind a keep-alive server, as DynamoDB and SQS keep connections alive.
scripts/emulator.sh stop
EMULATOR_KEEPALIVE=1 scripts/with-emulator.sh scripts/bench-steps.sh
