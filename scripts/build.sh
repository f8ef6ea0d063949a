#!/usr/bin/env bash
# make build: the deployable arm64 zips of the worker, the reconciler and the dispatcher, with
# cargo-lambda from PyPI. Output: target/lambda/{worker,reconciler,dispatcher}/bootstrap.zip
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/emulator.sh install-build
rustup target list --installed | grep -q aarch64-unknown-linux-gnu || rustup target add aarch64-unknown-linux-gnu
PATH="$PWD/.venv/bin:$PATH" cargo lambda build --release --arm64 --output-format zip \
  --bin worker --bin reconciler --bin dispatcher
ls -l target/lambda/worker/bootstrap.zip target/lambda/reconciler/bootstrap.zip \
  target/lambda/dispatcher/bootstrap.zip
