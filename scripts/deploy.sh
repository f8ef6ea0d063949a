#!/usr/bin/env bash
# make deploy: `sam build` and `sam deploy --guided` of template.yaml. Needs AWS credentials
# (nothing else here does). The SAM CLI comes from PyPI into .venv-sam, as for `make test`, and
# cargo-lambda into .venv, as for `make build`, because SAM's rust-cargolambda build method
# calls it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/emulator.sh install-build
scripts/emulator.sh install-sam
export PATH="$PWD/.venv/bin:$PWD/.venv-sam/bin:$PATH"
sam build --beta-features
sam deploy --guided "$@"
