#!/usr/bin/env bash
# make drill: the recovery drill on the emulator, printing its timeline.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/emulator.sh install
scripts/with-emulator.sh cargo test --quiet --test emulator -- --nocapture drill::
