#!/usr/bin/env bash
# The template through the SAM CLI as `sam deploy` would read it, with no AWS account:
# `sam validate` (the SAM transform) and `sam validate --lint`. And, so that the check is seen to
# bite, a copy with a misspelt event source property must be refused. (`--lint` alone runs the
# SAM CLI's own cfn-lint, which lets that copy pass: make test also runs cfn-lint 1.53.3.)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/emulator.sh install-sam
sam() { SAM_CLI_TELEMETRY=0 .venv-sam/bin/sam "$@" --region us-east-1; }
sam validate --template template.yaml
sam validate --lint --template template.yaml
broken=$(mktemp --suffix=.yaml)
trap 'rm -f "$broken"' EXIT
sed 's/FunctionResponseTypes:/FunctionResponseTypo:/' template.yaml > "$broken"
if sam validate --template "$broken" >/dev/null 2>&1; then
  echo "check_sam: sam validate passed a template with a misspelt property" >&2
  exit 1
fi
echo "check_sam: sam validate refuses a broken copy"
