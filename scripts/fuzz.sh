#!/usr/bin/env bash
# make fuzz: runs each fuzz target for FUZZ_SECONDS (default 600) with cargo-fuzz (from
# crates.io) on the nightly toolchain, starting from the committed seeds. Findings land in
# fuzz/artifacts/<target>/; the corpus grows in fuzz/corpus/<target>/ (neither is committed).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
# A pinned cargo-fuzz (with the lock file it was released with): a new one is taken on purpose.
fuzz_version=0.13.2
[ "$(cargo fuzz --version 2>/dev/null)" = "cargo-fuzz $fuzz_version" ] ||
  cargo install cargo-fuzz --version "$fuzz_version" --locked
seconds="${FUZZ_SECONDS:-600}"
for target in ${FUZZ_TARGETS:-message_body lambda_event}; do
  mkdir -p "corpus/$target"
  echo "== $target for $seconds s" >&2
  # No sanitizer: the crate forbids unsafe code; panics, overflows (debug assertions are on)
  # and timeouts are what these targets look for, and they run faster without one.
  cargo +nightly fuzz run --sanitizer none "$target" "corpus/$target" "seeds/$target" -- \
    -max_total_time="$seconds" -timeout=10 -print_final_stats=1
done
