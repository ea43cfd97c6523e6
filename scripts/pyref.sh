#!/usr/bin/env bash
# Prints the path of the Python interpreter of moerl's reference environment, creating it the
# first time (scripts/python-env.sh): the pinned packages of scripts/pyref/requirements.txt
# (torch, transformers, tokenizers, safetensors; about 4 GB with torch's CUDA libraries) in the
# tools cache. The tests that check moerl's Hugging Face models against transformers use it.
#
#   scripts/pyref.sh            # the interpreter's path (installs once, then only checks)
#   MOERL_PYREF_PYTHON=/path    # use this interpreter instead (it must have the packages)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
if [[ -n "${MOERL_PYREF_PYTHON:-}" ]]; then
  [[ -x "$MOERL_PYREF_PYTHON" ]] || {
    echo "pyref: MOERL_PYREF_PYTHON=$MOERL_PYREF_PYTHON is not an executable file." >&2
    exit 1
  }
  echo "$MOERL_PYREF_PYTHON"
  exit 0
fi
exec bash "$ROOT/scripts/python-env.sh" pyref "$ROOT/scripts/pyref/requirements.txt"
