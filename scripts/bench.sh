#!/usr/bin/env bash
# make bench: release build, emulator started and stopped here; prints markdown tables.
set -euo pipefail
cd "$(dirname "$0")/.."
started_here=0
if ! [ -f .emulator/pid ] || ! kill -0 "$(cat .emulator/pid)" 2>/dev/null; then
  scripts/emulator.sh start
  started_here=1
fi
cleanup() { if [ "$started_here" = 1 ]; then scripts/emulator.sh stop; fi; }
trap cleanup EXIT
eval "$(scripts/emulator.sh env)"
echo "machine: $(nproc) cores, $(uname -m), $(date -u +%Y-%m-%d)"
cargo build --release --quiet --example bench_heartbeat
echo '$ target/release/examples/bench_heartbeat'
target/release/examples/bench_heartbeat
