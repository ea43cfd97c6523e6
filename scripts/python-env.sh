#!/usr/bin/env bash
# Prints the path of the Python interpreter of a pinned virtual environment in the tools cache
# (outside the repository), creating it the first time from a requirements file.
#
#   scripts/python-env.sh NAME REQUIREMENTS
#
# The environment is ${MOERL_TOOLS_DIR:-~/.cache/moerl/tools}/NAME-<digest of REQUIREMENTS>:
# a changed pin makes a new one. It is built in a temporary folder and moved into place only
# when pip succeeded, so a half-made environment is never used. Progress goes to stderr.
set -euo pipefail

[[ $# -eq 2 ]] || {
  echo "usage: python-env.sh NAME REQUIREMENTS" >&2
  exit 2
}
name="$1"
requirements="$2"

die() {
  echo "$name: $*" >&2
  exit 1
}
[[ -f "$requirements" ]] || die "no requirements file $requirements"

digest="$(sha256sum "$requirements" | cut -c1-12)"
base="${MOERL_TOOLS_DIR:-${XDG_CACHE_HOME:-${HOME:?HOME is not set}/.cache}/moerl/tools}"
final="$base/$name-$digest"
if [[ -x "$final/bin/python" && -f "$final/.complete" ]]; then
  echo "$final/bin/python"
  exit 0
fi

python="$(command -v python3 || true)"
[[ -n "$python" ]] || die "python3 is needed to make the $name environment."
mkdir -p "$base"
find "$base" -maxdepth 1 -name ".build-$name-*" -mmin +1440 -exec rm -rf {} + 2>/dev/null || true
tmp="$(mktemp -d "$base/.build-$name-XXXXXX")"
# shellcheck disable=SC2064 # expand now: the trap removes this build's folder
trap "rm -rf '$tmp'" EXIT
started=$SECONDS
echo "$name: installing $requirements into $final (once)" >&2
"$python" -m venv "$tmp" >&2
"$tmp/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
  -r "$requirements" >&2 || die "pip could not install $requirements (see its output above)."
touch "$tmp/.complete"
# bin/python finds its environment through the pyvenv.cfg beside it, so the moved folder works
# (only its console scripts' shebangs name the old path, and nothing runs them).
rm -rf "$final"
mv "$tmp" "$final"
trap - EXIT
echo "$name: installed in $((SECONDS - started))s" >&2
echo "$final/bin/python"
