#!/usr/bin/env bash
# Runs a command with the local emulator up and the AWS SDK pointed at it: starts the emulator
# unless it already runs (then leaves it running), exports its variables, and stops what it
# started when the command ends, however it ends.
set -euo pipefail
cd "$(dirname "$0")/.."
started_here=0
if ! [ -f .emulator/pid ] || ! kill -0 "$(cat .emulator/pid)" 2>/dev/null; then
  scripts/emulator.sh start
  started_here=1
fi
# SECOND_DYNAMODB=1: dynalite as well, for the ledger's contract tests (make test sets it).
second_here=0
if [ "${SECOND_DYNAMODB:-0}" = 1 ] && ! { [ -f .emulator/dynalite.pid ] && kill -0 "$(cat .emulator/dynalite.pid)" 2>/dev/null; }; then
  scripts/emulator.sh start-second
  second_here=1
fi
cleanup() {
  if [ "$started_here" = 1 ]; then scripts/emulator.sh stop; fi
  if [ "$second_here" = 1 ]; then scripts/emulator.sh stop-second; fi
}
trap cleanup EXIT
# Ctrl-C or a kill ends the script as an exit, so that the emulator started here stops.
trap 'exit 130' INT TERM
eval "$(scripts/emulator.sh env)"
"$@"
