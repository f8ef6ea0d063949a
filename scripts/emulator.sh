#!/usr/bin/env bash
# The local AWS emulator: moto server from PyPI in a project venv, on 127.0.0.1 at a free port.
#
#   scripts/emulator.sh install   create .venv with scripts/requirements.txt (moto, cfn-lint)
#   scripts/emulator.sh install-build   and scripts/requirements-build.txt (cargo-lambda)
#   scripts/emulator.sh install-sam     .venv-sam with scripts/requirements-sam.txt (SAM CLI)
#   scripts/emulator.sh install-iam     the IAM evaluator (npm, scripts/iam/package-lock.json)
#   scripts/emulator.sh install-producers   the producer guide's TypeScript examples (npm,
#                                 examples/producers/typescript/package-lock.json), compiled
#   scripts/emulator.sh start-second    dynalite (npm), a second DynamoDB, on 127.0.0.1 at a free
#                                 port (SECOND_DYNAMODB_URL in `env`); stop-second stops it
#   scripts/emulator.sh start     install if needed, start, wait until it answers
#                                 (EMULATOR_KEEPALIVE=1: behind waitress, which keeps connections alive)
#   scripts/emulator.sh stop      stop it (by pid)
#   scripts/emulator.sh env       print the variables that point the AWS SDK at it
#   scripts/emulator.sh create TABLE QUEUE [--also-queue NAME ...]
#                                 create the job table, the queue and its DLQ, the results
#                                 bucket and the event bus; print their variables
#   scripts/emulator.sh local     create the local resources the sample events name (table and
#                                 queue `jobs`, queue `jobs.fifo`) and write their variables,
#                                 with the emulator's, to .emulator/lambda.env for
#                                 `cargo lambda watch --env-file .emulator/lambda.env`
#   scripts/emulator.sh reset     drop every resource (POST /moto-api/reset)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.venv"
state="$root/.emulator"
python_bin="${PYTHON:-python3}"

# Installs a requirements file ($2) into a venv ($1). Each file pins every package with the
# hashes of its files (scripts/pin-requirements.sh): pip installs those files, refuses one whose
# hash differs, and fetches nothing else. --no-deps because the file already lists every
# dependency (`pip check` makes sure), and the venv's pip 23 would take a dependency that asks
# for extras (aws-sam-cli's `boto3[crt]`) for one not pinned.
pip_install() {
  "$1/bin/pip" install --quiet --disable-pip-version-check --require-hashes --no-deps -r "$2"
  "$1/bin/pip" check >/dev/null || { "$1/bin/pip" check >&2; exit 1; }
}

# Installs scripts/requirements.txt into .venv, once per version of that file.
install() {
  local want stamp="$venv/.requirements"
  want=$(cat "$root/scripts/requirements.txt")
  if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    return
  fi
  echo "emulator: installing scripts/requirements.txt into .venv" >&2
  "$python_bin" -m venv "$venv"
  pip_install "$venv" "$root/scripts/requirements.txt"
  printf '%s' "$want" > "$stamp"
}

# Installs the npm packages of scripts/$1 (its package-lock.json) into scripts/$1, once per
# version of that file: the IAM evaluator (iam) and the second DynamoDB (dynalite).
npm_install() {
  local dir="$root/$1" want
  command -v npm >/dev/null || { echo "emulator: $1 needs Node.js and npm (apt-get install nodejs npm)" >&2; exit 1; }
  want=$(cat "$dir/package-lock.json")
  if [ "$(cat "$dir/node_modules/.lock" 2>/dev/null)" = "$want" ]; then
    return
  fi
  echo "emulator: installing $1/package-lock.json into $1" >&2
  (cd "$dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null)
  printf '%s' "$want" > "$dir/node_modules/.lock"
}

# Installs scripts/requirements-build.txt (cargo-lambda and its zig) into .venv, once per
# version of that file.
install_build() {
  install
  local want stamp="$venv/.requirements-build"
  want=$(cat "$root/scripts/requirements-build.txt")
  if [ -x "$venv/bin/cargo-lambda" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    return
  fi
  echo "emulator: installing scripts/requirements-build.txt into .venv" >&2
  pip_install "$venv" "$root/scripts/requirements-build.txt"
  printf '%s' "$want" > "$stamp"
}

# Installs scripts/requirements-sam.txt into .venv-sam, once per version of that file.
install_sam() {
  local want stamp="$root/.venv-sam/.requirements"
  want=$(cat "$root/scripts/requirements-sam.txt")
  if [ -x "$root/.venv-sam/bin/sam" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    return
  fi
  echo "emulator: installing scripts/requirements-sam.txt into .venv-sam" >&2
  "$python_bin" -m venv "$root/.venv-sam"
  pip_install "$root/.venv-sam" "$root/scripts/requirements-sam.txt"
  printf '%s' "$want" > "$stamp"
}

second_running() {
  [ -f "$state/dynalite.pid" ] && kill -0 "$(cat "$state/dynalite.pid")" 2>/dev/null
}

# dynalite in memory on 127.0.0.1 at a free port, tables active at once.
start_second() {
  install
  npm_install scripts/dynalite
  mkdir -p "$state"
  if second_running; then
    return
  fi
  local p
  p=$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  echo "$p" > "$state/dynalite.port"
  nohup node "$root/scripts/dynalite/node_modules/dynalite/cli.js" --host 127.0.0.1 --port "$p" \
    --createTableMs 0 --deleteTableMs 0 --updateTableMs 0 > "$state/dynalite.log" 2>&1 &
  echo $! > "$state/dynalite.pid"
  for _ in $(seq 1 100); do
    # Any HTTP answer (an unsigned request is refused) means it listens.
    if "$venv/bin/python" -c "
import urllib.request, urllib.error
try: urllib.request.urlopen('http://127.0.0.1:$p/', timeout=1)
except urllib.error.HTTPError: pass" 2>/dev/null; then
      echo "emulator: dynalite on 127.0.0.1:$p (pid $(cat "$state/dynalite.pid"))" >&2
      return
    fi
    sleep 0.2
  done
  echo "emulator: dynalite did not start; see $state/dynalite.log" >&2
  tail -20 "$state/dynalite.log" >&2 || true
  exit 1
}

stop_second() {
  if second_running; then
    kill "$(cat "$state/dynalite.pid")" 2>/dev/null || true
    echo "emulator: dynalite stopped" >&2
  fi
  rm -f "$state/dynalite.pid" "$state/dynalite.port"
}

port() { cat "$state/port" 2>/dev/null; }

running() {
  [ -f "$state/pid" ] && kill -0 "$(cat "$state/pid")" 2>/dev/null
}

start() {
  install
  mkdir -p "$state"
  if running; then
    return
  fi
  local p
  p=$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  echo "$p" > "$state/port"
  # The moto server speaks every service on one port; nothing listens beyond loopback.
  if [ "${EMULATOR_KEEPALIVE:-0}" = 1 ]; then
    # The same moto application behind a keep-alive server (benchmarks).
    nohup "$venv/bin/python" "$root/scripts/moto_keepalive.py" "$p" > "$state/moto.log" 2>&1 &
  else
    # moto's server, each DynamoDB request atomic as the real service's (moto_atomic.py says why).
    nohup "$venv/bin/python" "$root/scripts/moto_atomic.py" 127.0.0.1 "$p" > "$state/moto.log" 2>&1 &
  fi
  echo $! > "$state/pid"
  for _ in $(seq 1 100); do
    if "$venv/bin/python" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$p/moto-api/', timeout=1)" 2>/dev/null; then
      echo "emulator: moto on 127.0.0.1:$p (pid $(cat "$state/pid"))" >&2
      return
    fi
    sleep 0.2
  done
  echo "emulator: moto did not start; see $state/moto.log" >&2
  tail -20 "$state/moto.log" >&2 || true
  exit 1
}

stop() {
  if running; then
    kill "$(cat "$state/pid")" 2>/dev/null || true
    echo "emulator: stopped" >&2
  fi
  rm -f "$state/pid" "$state/port"
}

print_env() {
  running || { echo "emulator: not running (scripts/emulator.sh start)" >&2; exit 1; }
  cat <<VARS
export AWS_ENDPOINT_URL=http://127.0.0.1:$(port)
export AWS_ACCESS_KEY_ID=emulator
export AWS_SECRET_ACCESS_KEY=emulator
export AWS_REGION=us-east-1
export AWS_EC2_METADATA_DISABLED=true
VARS
  if second_running; then
    echo "export SECOND_DYNAMODB_URL=http://127.0.0.1:$(cat "$state/dynalite.port")"
  fi
}

case "${1:-}" in
  install) install ;;
  install-build) install_build ;;
  install-sam) install_sam ;;
  install-iam) npm_install scripts/iam ;;
  install-dynalite) npm_install scripts/dynalite ;;
  install-producers)
    # The producer guide's TypeScript examples, compiled (tests/emulator/producer_guide.rs).
    npm_install examples/producers/typescript
    (cd "$root/examples/producers/typescript" && node_modules/.bin/tsc -p .)
    ;;
  start-second) start_second ;;
  stop-second) stop_second ;;
  start) start ;;
  stop) stop ;;
  env) print_env ;;
  create)
    running || { echo "emulator: not running" >&2; exit 1; }
    AWS_ENDPOINT_URL="http://127.0.0.1:$(port)" "$venv/bin/python" "$root/scripts/create_resources.py" "${2:?table}" "${3:?queue}" "${@:4}"
    ;;
  local)
    running || { echo "emulator: not running" >&2; exit 1; }
    {
      print_env
      AWS_ENDPOINT_URL="http://127.0.0.1:$(port)" "$venv/bin/python" "$root/scripts/create_resources.py" jobs jobs --also-queue jobs.fifo
      echo "export PROVIDER=simulated"
    } | sed 's/^export //' > "$state/lambda.env"
    echo "emulator: local resources ready; their settings are in .emulator/lambda.env" >&2
    ;;
  reset)
    running || { echo "emulator: not running" >&2; exit 1; }
    "$venv/bin/python" -c "import urllib.request; urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:$(port)/moto-api/reset', method='POST'))"
    ;;
  *) echo "usage: $0 install|install-build|install-sam|install-iam|install-dynalite|install-producers|start|stop|start-second|stop-second|env|create TABLE QUEUE [--also-queue NAME ...]|local|reset" >&2; exit 2 ;;
esac
