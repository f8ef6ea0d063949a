#!/usr/bin/env bash
# make test: installs the Python tools, lints the template, and runs every test (unit, in-memory
# and emulator) with the emulator started and stopped around them.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/emulator.sh install
echo "== cfn-lint template.yaml" >&2
.venv/bin/cfn-lint template.yaml
echo "== template consistency" >&2
.venv/bin/python scripts/check_template.py --self-test template.yaml
echo "== rust-version against the lock" >&2
.venv/bin/python scripts/check_msrv.py --self-test
echo "== module layout" >&2
.venv/bin/python scripts/check_layout.py --self-test src
echo "== cargo test" >&2
scripts/with-emulator.sh cargo test --all-targets "$@"
