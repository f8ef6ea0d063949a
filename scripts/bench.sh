#!/usr/bin/env bash
# make bench: release builds, then every benchmark with the emulator up, each step's output kept
# in target/bench/; then BENCHMARKS.md is written from this one run (scripts/bench_report.py),
# dated, with its commit and its machine, and its pictures drawn into benchmarks/.
set -euo pipefail
cd "$(dirname "$0")/.."
# Figures are a commit's: a tree with local changes (tracked or not) in what is measured is
# refused, unless BENCH_DIRTY=1, and then BENCHMARKS.md's header says so.
changes=$(git status --porcelain -- src examples scripts benches Cargo.toml Cargo.lock build.rs)
if [ -n "$changes" ] && [ "${BENCH_DIRTY:-}" != 1 ]; then
  echo "make bench: the tree has local changes; commit them first (or BENCH_DIRTY=1 make bench):" >&2
  echo "$changes" >&2
  exit 2
fi
out=target/bench
rm -rf "$out"
mkdir -p "$out"
cargo build --release --quiet --bin worker --example bench_heartbeat --example bench_batch \
  --example bench_cost --example chaos --example bench_plots
# moto behind a keep-alive server, as DynamoDB and SQS keep connections alive.
scripts/emulator.sh stop
EMULATOR_KEEPALIVE=1 scripts/with-emulator.sh scripts/bench-steps.sh "$out"
dirty=$([ -z "$changes" ] && echo "" || echo " with local changes")
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//' || true)
cat > "$out/meta.json" <<META
{"date": "$(date -u +%Y-%m-%d)", "commit": "$(git rev-parse --short HEAD)$dirty",
 "machine": "$(nproc) cores, $(uname -m)${cpu:+, $cpu}, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)",
 "rustc": "$(rustc -V | cut -d' ' -f1-2)"}
META
.venv/bin/python scripts/bench_report.py --plots "$out"
target/release/examples/bench_plots "$out" benchmarks
.venv/bin/python scripts/bench_report.py "$out" BENCHMARKS.md
echo "wrote BENCHMARKS.md and benchmarks/*.svg from this run"
