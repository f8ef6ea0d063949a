#!/usr/bin/env bash
# make demo: starts the emulator, creates a fresh table and queue, runs the demo, stops the emulator.
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
suffix=$(date +%s)
eval "$(scripts/emulator.sh create "jobs-demo-$suffix" "jobs-demo-$suffix")"
cargo run --quiet --example demo
