#!/usr/bin/env bash
# `make test`'s tests, already built, with the emulator up: the emulator's binary in the
# background (its output kept in .emulator/tests.log and shown whole when it ends), every other
# target in the foreground. Fails when either fails.
set -euo pipefail
cd "$(dirname "$0")/.."
log=.emulator/tests.log
cargo test --test emulator > "$log" 2>&1 &
emulator=$!
# Every other test binary: the library's, the binaries', the examples' and each of tests/*/.
others=(--lib --bins --examples)
for main in tests/*/main.rs; do
  name=$(basename "$(dirname "$main")")
  [ "$name" = emulator ] || others+=(--test "$name")
done
status=0
# At a lower priority: the emulator's tests keep their time limits (invocations of a few
# seconds), and these use what CPU they leave.
nice -n 10 cargo test "${others[@]}" || status=$?
wait "$emulator" || status=1
cat "$log"
exit "$status"
