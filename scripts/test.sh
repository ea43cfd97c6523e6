#!/usr/bin/env bash
# The one test command: sets the machine up (scripts/setup.sh, sanitizer build included),
# then lint, the native tests (ctest, plain and ASan builds) and the TypeScript tests
# (node's test runner on the compiled tests in dist/). The last line is always
#   total: N passed, M failed
# where N and M count ctest and node tests, and M also counts each failed build or lint step.
# The exit code is non-zero when M is.
#
#   scripts/test.sh [--only PARTS] [--skip-setup] [--name PATTERN] [-R REGEX] [PATH...]
#
#   --only PARTS    comma-separated: lint, native, node (default: all three)
#   --skip-setup    do not run scripts/setup.sh (dist/ and native builds are used as they are)
#   --name PATTERN  node tests whose name matches PATTERN (--test-name-pattern)
#   -R REGEX        ctest tests matching REGEX
#   PATH...         node test files or folders (test/unit, test/integration/x.test.ts);
#                   PATHs alone imply --only node, -R alone --only native.
# MOERL_SKIP_NATIVE=1 skips the native builds and tests; MOERL_TEST_TIMEOUT_MS limits each
# node test (default 600000), MOERL_CTEST_TIMEOUT each ctest test in seconds (default 600).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT" || exit 2

usage() {
  sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed -e '/^set -uo/d' -e 's/^# \{0,1\}//'
  exit "${1:-2}"
}

parts=""
skip_setup=0
name_pattern=""
ctest_regex=""
paths=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --only)
      [[ $# -ge 2 ]] || usage >&2
      parts="$2"
      shift 2
      ;;
    --only=*) parts="${1#--only=}" && shift ;;
    --skip-setup) skip_setup=1 && shift ;;
    --name)
      [[ $# -ge 2 ]] || usage >&2
      name_pattern="$2"
      shift 2
      ;;
    -R)
      [[ $# -ge 2 ]] || usage >&2
      ctest_regex="$2"
      shift 2
      ;;
    -h | --help) usage 0 ;;
    -*) echo "test.sh: unknown option $1" >&2 && usage >&2 ;;
    *) paths+=("$1") && shift ;;
  esac
done
if [[ -z $parts ]]; then
  if [[ ${#paths[@]} -gt 0 || -n $name_pattern ]]; then
    parts=node
  elif [[ -n $ctest_regex ]]; then
    parts=native
  else
    parts=lint,native,node
  fi
fi
want() { [[ ",$parts," == *",$1,"* ]]; }
for part in ${parts//,/ }; do
  [[ $part == lint || $part == native || $part == node ]] || {
    echo "test.sh: unknown part '$part' (lint, native, node)" >&2
    exit 2
  }
done
skip_native=0
[[ ${MOERL_SKIP_NATIVE:-0} == 1 ]] && skip_native=1

# ---- bookkeeping: every outcome is one summary line; the totals are the last line ----
passed=0
failed=0
summary=()
record() { summary+=("$(printf '  %-18s %s' "$1" "$2")"); }
fail_step() {
  failed=$((failed + 1))
  record "$1" "FAILED"
}
finish() {
  echo
  echo "summary:"
  printf '%s\n' "${summary[@]}"
  echo "total: $passed passed, $failed failed"
  [[ $failed -eq 0 ]]
  exit $?
}
trap 'record interrupted "(stopped by a signal)"; failed=$((failed + 1)); finish' INT TERM

section() { echo && echo "==> $*"; }

# ---- setup: only the steps the selected parts need ----
native_ok=1
native_asan_ok=1
if [[ $skip_setup -eq 0 ]]; then
  section "setup"
  base=(npm)
  want native && base=(packages "${base[@]}")
  want node && base+=(tools)
  if ! bash scripts/setup.sh "${base[@]}"; then
    fail_step setup
    finish
  fi
  if want node || want lint; then
    bash scripts/setup.sh ts || fail_step "build (tsc)"
  fi
  if want native && [[ $skip_native -eq 0 ]]; then
    bash scripts/setup.sh native || {
      native_ok=0
      fail_step "build native"
    }
    bash scripts/setup.sh native-asan || {
      native_asan_ok=0
      fail_step "build native-asan"
    }
  fi
fi

# ---- lint ----
if want lint; then
  section "lint"
  if npm run --silent lint; then
    record lint ok
  else
    fail_step lint
  fi
fi

# ---- native: ctest in each build dir ----
# run_ctest <build dir> <label>
run_ctest() {
  local dir="$1" label="$2"
  if [[ ! -f "$dir/CTestTestfile.cmake" ]]; then
    record "$label" "skipped (not built)"
    return
  fi
  local count
  count="$(ctest --test-dir "$dir" -N 2>/dev/null | sed -n 's/^Total Tests: *\([0-9]*\).*/\1/p')"
  if [[ -z $count || $count -eq 0 ]]; then
    record "$label" "skipped (no tests yet)"
    return
  fi
  section "ctest $dir"
  local out rc=0
  out="$(mktemp)"
  local args=(--test-dir "$dir" --output-on-failure --timeout "${MOERL_CTEST_TIMEOUT:-600}")
  [[ -n $ctest_regex ]] && args+=(-R "$ctest_regex")
  ctest "${args[@]}" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  # "100% tests passed, 0 tests failed out of 12"
  local line total bad
  line="$(grep -E '[0-9]+ tests failed out of [0-9]+' "$out" | tail -n 1)"
  rm -f "$out"
  if [[ -z $line ]]; then
    if [[ $rc -eq 0 ]]; then
      record "$label" "no tests matched"
    else
      fail_step "$label"
    fi
    return
  fi
  bad="$(sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\1/' <<<"$line")"
  total="$(sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\2/' <<<"$line")"
  passed=$((passed + total - bad))
  failed=$((failed + bad))
  record "$label" "$((total - bad)) passed, $bad failed"
}

if want native; then
  if [[ $skip_native -eq 1 ]]; then
    record native "skipped (MOERL_SKIP_NATIVE=1)"
  else
    if [[ $native_ok -eq 1 ]]; then run_ctest native/build "ctest"; else record ctest "not run (build failed)"; fi
    if [[ $native_asan_ok -eq 1 ]]; then
      run_ctest native/build-asan "ctest (asan)"
    else
      record "ctest (asan)" "not run (build failed)"
    fi
  fi
fi

# ---- node: compiled tests whose TypeScript source exists (stale files in dist/ are ignored) ----
# Prints the dist/ .js file for each test source under the given paths.
node_test_files() {
  local path
  for path in "$@"; do
    path="${path%/}"
    path="${path#./}"
    path="${path#dist/}"
    if [[ -d $path ]]; then
      find "$path" -name '*.test.ts' -not -path '*/node_modules/*' | sort
    elif [[ $path == *.test.ts || $path == *.test.js ]]; then
      local source="${path%.js}"
      source="${source%.ts}.ts"
      if [[ -f $source ]]; then
        echo "$source"
      else
        echo "test.sh: no test source $source" >&2
        return 1
      fi
    else
      echo "test.sh: $path is not a test folder or a .test.ts file" >&2
      return 1
    fi
  done | sed -E 's#^(.*)\.ts$#dist/\1.js#'
}

if want node; then
  section "node tests"
  # tsc emits dist/ even when it reports type errors: the tests still run, and its failure
  # is counted once, above.
  [[ ${#paths[@]} -eq 0 ]] && paths=(test)
  files=()
  if listing="$(node_test_files "${paths[@]}")"; then
    [[ -n $listing ]] && mapfile -t files <<<"$listing"
    missing=()
    for file in "${files[@]}"; do [[ -f $file ]] || missing+=("$file"); done
    if [[ ${#missing[@]} -gt 0 ]]; then
      echo "test.sh: not compiled (run without --skip-setup): ${missing[*]}" >&2
      fail_step node
    elif [[ ${#files[@]} -eq 0 ]]; then
      record node "no test files"
    else
      tap="$(mktemp)"
      node_args=(--test --test-concurrency=1 --test-timeout="${MOERL_TEST_TIMEOUT_MS:-600000}")
      node_args+=(--test-reporter=spec --test-reporter-destination=stdout)
      node_args+=(--test-reporter=tap --test-reporter-destination="$tap")
      [[ -n $name_pattern ]] && node_args+=(--test-name-pattern="$name_pattern")
      node "${node_args[@]}" "${files[@]}"
      rc=$?
      # The runner's closing "# pass N" / "# fail N" / "# cancelled N" lines.
      count() { sed -n "s/^# $1 \([0-9]*\)$/\1/p" "$tap" | tail -n 1; }
      node_pass="$(count pass)"
      node_fail="$(count fail)"
      node_cancelled="$(count cancelled)"
      rm -f "$tap"
      if [[ -z $node_pass ]]; then
        fail_step node
      else
        bad=$((node_fail + ${node_cancelled:-0}))
        # A non-zero exit with no failed test (a crash in a hook, an unhandled error).
        [[ $rc -ne 0 && $bad -eq 0 ]] && bad=1
        passed=$((passed + node_pass))
        failed=$((failed + bad))
        record node "$node_pass passed, $bad failed"
      fi
    fi
  else
    fail_step node
  fi
fi

finish
