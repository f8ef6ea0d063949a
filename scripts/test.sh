#!/usr/bin/env bash
# make test: installs the Python tools (moto, cfn-lint, cargo-lambda, the SAM CLI), lints the
# template, and runs every test (unit, in-memory and emulator) with the emulator started and
# stopped around them.
set -euo pipefail
cd "$(dirname "$0")/.."
# The SAM CLI installs (into its own venv) while the rest runs; its check comes last.
scripts/emulator.sh install-sam > .sam-install.log 2>&1 &
sam_install=$!
# While the tests build: moto and cfn-lint; cargo-lambda for tests/emulator/invoke.rs (`make
# invoke` under cargo-lambda); the IAM evaluator tests/emulator/iam.rs judges each role's calls
# with (npm); the producer guide's TypeScript examples tests/emulator/producer_guide.rs runs
# (npm). At the lowest priority: on a small machine they take the CPU only where the compiler
# leaves it (its links, its last crates), and wait on the network beside it; at worst they
# finish after the build, as they would before it.
nice -n 19 bash -c '
  set -euo pipefail
  scripts/emulator.sh install-build
  scripts/emulator.sh install-iam
  scripts/emulator.sh install-producers
' > .tools-install.log 2>&1 &
tools_install=$!
# A failed build or check leaves no install running behind it.
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
if [ "$#" -eq 0 ]; then
  echo "== cargo test: build" >&2
  cargo test --all-targets --no-run
fi
wait "$tools_install" || { cat .tools-install.log >&2; exit 1; }
rm -f .tools-install.log
echo "== cfn-lint template.yaml" >&2
.venv/bin/cfn-lint template.yaml
echo "== template consistency" >&2
.venv/bin/python scripts/check_template.py --self-test template.yaml
echo "== IAM: the template's roles judged on known requests" >&2
.venv/bin/python scripts/iam_check.py --self-test template.yaml
echo "== rust-version against the lock" >&2
.venv/bin/python scripts/check_msrv.py --self-test
echo "== documents against the code" >&2
.venv/bin/python scripts/check_docs.py --self-test
echo "== module layout" >&2
.venv/bin/python scripts/check_layout.py --self-test src
echo "== cargo test" >&2
# With dynalite beside moto: the ledger's contract tests run against both. Arguments go to one
# `cargo test --all-targets`; without them, the tests are built once and the emulator's binary
# (which waits on the emulator most of its time) runs beside the others (which use the CPU).
if [ "$#" -gt 0 ]; then
  SECOND_DYNAMODB=1 scripts/with-emulator.sh cargo test --all-targets "$@"
else
  SECOND_DYNAMODB=1 scripts/with-emulator.sh scripts/test_beside.sh
fi
echo "== sam validate" >&2
wait "$sam_install" || { cat .sam-install.log >&2; exit 1; }
rm -f .sam-install.log
scripts/check_sam.sh
