#!/usr/bin/env bash
# make demo: a fresh table and queue on the emulator, then the demo against them.
set -euo pipefail
cd "$(dirname "$0")/.."
run() {
  suffix=$(date +%s)
  eval "$(scripts/emulator.sh create "jobs-demo-$suffix" "jobs-demo-$suffix")"
  cargo run --quiet --example demo
}
export -f run
scripts/with-emulator.sh bash -c run
