#!/usr/bin/env bash
# Prints the path of the Python interpreter that moerl's reward functions use (the math
# verifier's math-verify, and users' Python reward functions), creating its environment the
# first time: the pinned, hash-checked packages of scripts/reward-python/requirements.txt in
# the tools cache (about 120 MB; scripts/python-env.sh).
#
#   scripts/reward-python.sh        # the interpreter's path (installs once, then only checks)
#   MOERL_REWARD_PYTHON=/path       # use this interpreter instead (it must have math-verify)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"

if [[ -n "${MOERL_REWARD_PYTHON:-}" ]]; then
  [[ -x "$MOERL_REWARD_PYTHON" ]] || {
    echo "reward-python: MOERL_REWARD_PYTHON=$MOERL_REWARD_PYTHON is not an executable file." >&2
    exit 1
  }
  echo "$MOERL_REWARD_PYTHON"
  exit 0
fi
exec bash "$ROOT/scripts/python-env.sh" reward-python "$ROOT/scripts/reward-python/requirements.txt"
