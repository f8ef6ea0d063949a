#!/usr/bin/env bash
# make test: installs the Python tools, lints the template, starts the emulator, runs every
# test (unit, in-memory and emulator), and stops the emulator whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/emulator.sh install
echo "== cfn-lint template.yaml" >&2
.venv/bin/cfn-lint template.yaml
started_here=0
if ! [ -f .emulator/pid ] || ! kill -0 "$(cat .emulator/pid)" 2>/dev/null; then
  scripts/emulator.sh start
  started_here=1
fi
cleanup() { if [ "$started_here" = 1 ]; then scripts/emulator.sh stop; fi; }
trap cleanup EXIT
eval "$(scripts/emulator.sh env)"
echo "== cargo test" >&2
cargo test --all-targets "$@"
