#!/usr/bin/env bash
# make local: the emulator with a table, a queue and a bucket, and the worker and the dispatcher
# running on them until Ctrl-C. Their settings go to .emulator/local.env, for jobctl in another
# terminal:  . .emulator/local.env && cargo run --bin jobctl -- submit events/jobs.jsonl
set -euo pipefail
cd "$(dirname "$0")/.."
run() {
  suffix=$(date +%s)
  resources=$(scripts/emulator.sh create "jobs-local-$suffix" "jobs-local-$suffix")
  eval "$resources"
  # jobctl dlq believes the worker's letters: the emulator names every sender so.
  { scripts/emulator.sh env; echo "$resources"; echo "export TRUSTED_SENDERS=AIDAIT2UOQQY3AUEKVGXU"; } > .emulator/local.env
  cat <<'HELP'
Settings for jobctl are in .emulator/local.env. In another terminal:
  . .emulator/local.env
  cargo run --bin jobctl -- submit events/jobs.jsonl
  cargo run --bin jobctl -- show local-summary-1
  cargo run --bin jobctl -- result local-summary-1
HELP
  cargo run --quiet --example local
}
export -f run
# jobctl first, with the features it is run with, so that the other terminal's first
# `cargo run --bin jobctl` starts at once instead of building the tree again.
echo "local: building jobctl, then the worker and the dispatcher" >&2
cargo build --quiet --bin jobctl
scripts/with-emulator.sh bash -c run
