#!/usr/bin/env bash
# make bench: release build, then the benchmarks with the emulator up; prints markdown tables.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "machine: $(nproc) cores, $(uname -m), $(date -u +%Y-%m-%d)"
cargo build --release --quiet --example bench_heartbeat
echo '$ target/release/examples/bench_heartbeat'
scripts/with-emulator.sh target/release/examples/bench_heartbeat
