#!/usr/bin/env bash
# make deploy: `sam build` and `sam deploy --guided` of template.yaml. Needs the SAM CLI and AWS
# credentials (neither is needed by anything else here); cargo-lambda comes from PyPI as for
# `make build`, because SAM's rust-cargolambda build method calls it.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v sam >/dev/null 2>&1; then
  echo "deploy: the SAM CLI is not installed (pip install aws-sam-cli, or see the AWS docs)" >&2
  exit 2
fi
scripts/emulator.sh install
if ! .venv/bin/python -c "import importlib.metadata as m; m.version('cargo-lambda')" >/dev/null 2>&1; then
  .venv/bin/pip install --quiet --disable-pip-version-check -r scripts/requirements-build.txt
fi
export PATH="$PWD/.venv/bin:$PATH"
sam build --beta-features
sam deploy --guided "$@"
