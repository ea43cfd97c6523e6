#!/usr/bin/env bash
# Prints the path of the Python interpreter of the tests' OpenEnv environment, creating it the
# first time (scripts/python-env.sh): the pinned packages of scripts/openenv/requirements.txt in
# the tools cache. The OpenEnv environment tests serve their environments with it.
#
#   scripts/openenv.sh            # the interpreter's path (installs once, then only checks)
#   MOERL_OPENENV_PYTHON=/path    # use this interpreter instead (it must have the packages)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
if [[ -n "${MOERL_OPENENV_PYTHON:-}" ]]; then
  [[ -x "$MOERL_OPENENV_PYTHON" ]] || {
    echo "openenv: MOERL_OPENENV_PYTHON=$MOERL_OPENENV_PYTHON is not an executable file." >&2
    exit 1
  }
  echo "$MOERL_OPENENV_PYTHON"
  exit 0
fi
exec bash "$ROOT/scripts/python-env.sh" openenv "$ROOT/scripts/openenv/requirements.txt"
