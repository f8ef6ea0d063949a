#!/usr/bin/env bash
# Compiles the top-level pins of scripts/requirements*.in, edited by hand, into the
# scripts/requirements*.txt that scripts/emulator.sh installs with `pip install --require-hashes`:
# every dependency pinned, with the hashes of its files on PyPI, so that an install gets the files
# that were checked and nothing else. Versions already in a .txt are kept while its .in allows
# them; `scripts/pin-requirements.sh --upgrade` takes the newest. pip-tools runs from a
# throwaway venv.
set -euo pipefail
cd "$(dirname "$0")/.."
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
"${PYTHON:-python3}" -m venv "$tools"
"$tools/bin/pip" install --quiet --disable-pip-version-check pip-tools==7.6.2
python=$("$tools/bin/python" -c \
  'import platform as p; print("Python", p.python_version(), "on", p.system(), p.machine())')
# requirements-build.in is constrained by requirements.txt, so that one comes first.
for name in requirements requirements-build requirements-sam; do
  out="scripts/$name.txt"
  # Without this machine's find-links: the files and hashes are those on PyPI.
  env -u PIP_FIND_LINKS "$tools/bin/pip-compile" --quiet --generate-hashes --allow-unsafe \
    --strip-extras --no-emit-find-links --no-header "$@" --output-file "$out" "scripts/$name.in"
  {
    echo "# Generated from scripts/$name.in by scripts/pin-requirements.sh"
    echo "# (pip-tools 7.6.2, $python): edit the .in and run the script again."
    echo "# Resolved for that Python: another version or platform may need other dependencies."
    cat "$out"
  } > "$out.new"
  mv "$out.new" "$out"
done
