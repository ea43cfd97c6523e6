#!/usr/bin/env bash
# The hf-arith example in one command (npm run example:hf-arith): sets the machine up (the
# native tools, and once the Python reference environment that makes the model), puts the tiny
# model and the dataset in the example's store, then runs examples/hf-arith/spec.yaml on its own
# dev server and worker. Arguments go to `moerl demo` (e.g. --set seed=2 --json).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)"
cd "$ROOT"
bash scripts/setup.sh
STORE=.moerl/hf-arith/store
if [[ ! -f "$STORE/models/tiny-qwen3/config.json" ]]; then
  PYTHON="$(bash scripts/setup.sh pyref >&2 && bash scripts/pyref.sh)"
  "$PYTHON" test/reference/hf_models.py make "$STORE/models/tiny-qwen3" --family qwen3_moe
fi
node dist/examples/hf-arith/make-dataset.js "$STORE/datasets/hf-arith"
exec node bin/moerl.js demo --spec examples/hf-arith/spec.yaml --state-dir .moerl/hf-arith/dev "$@"
