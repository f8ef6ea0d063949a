#!/usr/bin/env bash
# make bench-against AGAINST=<commit>: instructions per DynamoDB request of this tree's handler
# against another commit's, counted by valgrind's callgrind on the same emulator, for each of
# `bench_batch only`'s kinds (the SDK's floor, the ledger's writes alone, fresh and redelivered
# records, 10 records a batch). Counted instructions repeat within about a percent from run to
# run where CPU time on a shared machine drifts by a tenth, so a few percent between two builds
# can be seen. Each kind runs twice per build (one round, then RUN_MS of rounds) and the
# difference is divided by the difference in requests: the set-up cancels out.
#
# Needs valgrind (Debian: `apt-get install valgrind`); builds `bench_batch` in the profiling
# profile for both trees (the other in a git worktree under target/against/, sharing target/).
set -euo pipefail
cd "$(dirname "$0")/.."
# Both builds in this tree's target/, whatever the environment names: the binaries are copied
# from it.
export CARGO_TARGET_DIR="$PWD/target"
against=${1:?usage: scripts/bench-against.sh <commit>}
run_ms=${RUN_MS:-20000}
command -v valgrind >/dev/null || {
  echo "bench-against: valgrind is not installed (Debian: apt-get install valgrind)" >&2
  exit 1
}
sha=$(git rev-parse --short "$against^{commit}")
dir=target/against
mkdir -p "$dir"
tree="$dir/src-$sha"
rm -rf "$tree"
git worktree prune
git worktree add --detach "$tree" "$sha" >/dev/null
trap 'git worktree remove --force "$tree" 2>/dev/null || true' EXIT
echo "== building bench_batch at $sha, then here" >&2
(cd "$tree" && cargo build --profile profiling --example bench_batch)
cp "$CARGO_TARGET_DIR/profiling/examples/bench_batch" "$dir/bench_batch-$sha"
cargo build --profile profiling --example bench_batch
cp "$CARGO_TARGET_DIR/profiling/examples/bench_batch" "$dir/bench_batch-here"

# Instructions and requests of one run: `<instructions> <requests>`.
count() {
  local bin=$1 kind=$2 ms=$3 out line requests
  out="$dir/callgrind.out"
  # A commit whose `bench_batch only` does not print its request count cannot be compared.
  line=$(valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" only "$kind" 10 "$ms" \
    2>"$dir/valgrind-$kind.log" | grep "DynamoDB requests") || {
    echo "bench-against: no request count from $bin only $kind ($dir/valgrind-$kind.log)" >&2
    exit 1
  }
  requests=$(sed -E 's/.*, ([0-9]+) DynamoDB requests.*/\1/' <<<"$line")
  echo "$(awk '/^(summary|totals):/ {print $2; exit}' "$out") $requests"
}

# Instructions per request of `kind` in `bin`, the set-up taken out.
per_request() {
  local bin=$1 kind=$2 short long
  short=$(count "$bin" "$kind" 1) || exit 1
  long=$(count "$bin" "$kind" "$run_ms") || exit 1
  awk -v s="$short" -v l="$long" 'BEGIN {
    split(s, a, " "); split(l, b, " ");
    printf "%.0f", (b[1] - a[1]) / (b[2] - a[2]) }'
}

export -f count per_request
export dir run_ms
scripts/with-emulator.sh bash -c '
  set -euo pipefail
  echo
  echo "Instructions per DynamoDB request (callgrind), 10 records a batch: '"$sha"' against this tree"
  echo
  echo "| kind | '"$sha"' | ÷ its floor | this tree | ÷ its floor | this tree ÷ '"$sha"' |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: |"
  for kind in floor ledger fresh redelivered; do
    old=$(per_request "$dir/bench_batch-'"$sha"'" "$kind") || exit 1
    new=$(per_request "$dir/bench_batch-here" "$kind") || exit 1
    if [ "$kind" = floor ]; then old_floor=$old; new_floor=$new; fi
    awk -v k="$kind" -v o="$old" -v n="$new" -v of="$old_floor" -v nf="$new_floor" \
      "BEGIN { printf \"| %s | %.1fk | %.3f | %.1fk | %.3f | %.3f |\n\", k, o/1e3, o/of, n/1e3, n/nf, n/o }"
  done
'
