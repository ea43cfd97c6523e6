#!/usr/bin/env bash
# The one test command: sets the machine up (scripts/setup.sh, sanitizer build included),
# then lint, the native tests (ctest, plain and ASan builds), the TypeScript tests (node's test
# runner on the compiled tests in dist/) and, again on the current Node.js LTS
# (scripts/node-lts.sh), the unit tests and the campaign test. Two lanes run side by side: the
# test cluster's (the Kubernetes tools and the node's images built when missing, then the
# test/k8s files, one at a time: one real node per host) and the host's (lint, ctest and the
# node test files while its own builds — llama.cpp, the ASan build, the LTS — run in the
# background; then what needed those); builds run below the tests' priority, and the cluster
# lane's output follows the host lane's. The last line is always
#   total: N passed, M failed, K skipped
# where N, M and K count ctest and node tests (a skipped suite counts once), and M also counts
# each failed build or lint step. With CI=true a node test skipped because the native tools are
# not built, the Python reference environment (scripts/pyref.sh) is not installed, or llama.cpp
# (scripts/llamacpp.sh) is not built, counts as failed, not skipped. The exit code is non-zero
# when M is.
#
#   scripts/test.sh [--only PARTS] [--skip-setup] [--name PATTERN] [-R REGEX] [PATH...]
#
#   --only PARTS    comma-separated: lint, native, node, node-lts (default: all four)
#   --skip-setup    do not run scripts/setup.sh (dist/ and native builds are used as they are)
#   --name PATTERN  node tests whose name matches PATTERN (--test-name-pattern)
#   -R REGEX        ctest tests matching REGEX
#   PATH...         node test files or folders (test/unit, test/integration/x.test.ts);
#                   PATHs alone imply --only node, -R alone --only native.
# MOERL_SKIP_NATIVE=1 skips the native builds and tests. Limits: MOERL_TEST_TIMEOUT_MS per
# node test (default 600000; node applies it to a whole file too), MOERL_TEST_FILE_TIMEOUT per
# node test file in seconds (default 900), MOERL_CTEST_TIMEOUT per ctest test in seconds
# (default 600); test/k8s/pytorch-node.test.ts gets at least 1200000 ms and 1500 s (its node
# imports a 7 GB image).
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
    parts=lint,native,node,node-lts
  fi
fi
want() { [[ ",$parts," == *",$1,"* ]]; }
for part in ${parts//,/ }; do
  [[ $part == lint || $part == native || $part == node || $part == node-lts ]] || {
    echo "test.sh: unknown part '$part' (lint, native, node, node-lts)" >&2
    exit 2
  }
done
skip_native=0
[[ ${MOERL_SKIP_NATIVE:-0} == 1 ]] && skip_native=1

# ---- bookkeeping: every outcome is one summary line; the totals are the last line ----
passed=0
failed=0
skipped=0
summary=()
failure_reports=()
record() { summary+=("$(printf '  %-18s %s' "$1" "$2")"); }
fail_step() {
  failed=$((failed + 1))
  record "$1" "FAILED"
}
finish() {
  echo
  # The failed files' own reports again, last, where a reader of only the log's tail sees them.
  if [[ ${#failure_reports[@]} -gt 0 ]]; then
    echo "failures:"
    printf '%s\n' "${failure_reports[@]}"
    echo
  fi
  echo "summary:"
  printf '%s\n' "${summary[@]}"
  echo "total: $passed passed, $failed failed, $skipped skipped"
  [[ $failed -eq 0 ]]
  exit $?
}
# shellcheck disable=SC2317 # called by the trap
on_signal() {
  [[ -n ${current_group:-} ]] && sweep_group "$current_group"
  [[ -n ${lane_pid:-} ]] && stop_cluster_lane
  [[ -n ${host_builds:-} ]] && kill_tree "$host_builds_pid"
  record interrupted "(stopped by a signal)"
  failed=$((failed + 1))
  finish
}
trap on_signal INT TERM

section() { echo && echo "==> $*"; }

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
  if [[ -z $line ]]; then
    rm -f "$out"
    if [[ $rc -eq 0 ]]; then
      record "$label" "no tests matched"
    else
      fail_step "$label"
    fi
    return
  fi
  bad="$(sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\1/' <<<"$line")"
  total="$(sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\2/' <<<"$line")"
  # Under "The following tests did not run": a skipped test, which the total counts (and the
  # percentage as passed), and a disabled one, which it does not.
  local skip disabled
  skip="$(grep -cE '^[[:space:]]*[0-9]+ - .* \(Skipped\)$' "$out")"
  disabled="$(grep -cE '^[[:space:]]*[0-9]+ - .* \(Disabled\)$' "$out")"
  rm -f "$out"
  passed=$((passed + total - bad - skip))
  failed=$((failed + bad))
  skipped=$((skipped + skip + disabled))
  record "$label" "$((total - bad - skip)) passed, $bad failed, $((skip + disabled)) skipped"
}

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

# run_node_file <compiled test file>: node's test runner on one file, in a process group of its
# own under `timeout`. Whatever the file leaves running (a dev server whose test process
# died, a worker that ignores SIGTERM) is killed with the group when the file is done, so no
# file can hang the run or leave servers behind.
node_file_notes=()
current_group=""
# The skip reason of test/support/native-tools.ts: under CI such a skip hides tests that must run.
native_skip_reason='native tools not built'
# And that of test/support/python-reference.ts: tests against transformers must run under CI too.
pyref_skip_reason='python reference not installed'
# And that of activities/engines/llamacpp.ts: the llama.cpp rollout engine tests must run under CI.
llamacpp_skip_reason='llama.cpp not built'
note_file() { node_file_notes+=("$(printf '  %-18s %s' '' "$1")"); }
# keep_failure_report <file> <spec report>: the report's "failing tests" part (or its last
# lines when the file never got that far: killed, crashed) without Node's own stack frames, at
# most 60 lines.
keep_failure_report() {
  local file="$1" report="$2" part
  part="$(sed -n '/^✖ failing tests:$/,$p' "$report" | sed '1d' | grep -vE '^ +at (.*\()?node:' | head -n 60)"
  [[ -n $part ]] || part="$(tail -n 30 "$report")"
  failure_reports+=("--- $file" "$part")
}
run_node_file() {
  local file="$1" tap rc report
  tap="$(mktemp)"
  report="$(mktemp)"
  local limit_ms="${MOERL_TEST_TIMEOUT_MS:-600000}" limit_s="${MOERL_TEST_FILE_TIMEOUT:-900}"
  if [[ $file == */pytorch-node.test.js ]]; then
    limit_ms=$((limit_ms > 1200000 ? limit_ms : 1200000))
    limit_s=$((limit_s > 1500 ? limit_s : 1500))
  fi
  local args=(--test --test-concurrency=1 --test-timeout="$limit_ms")
  args+=(--test-reporter=spec --test-reporter-destination=stdout)
  args+=(--test-reporter=tap --test-reporter-destination="$tap")
  args+=(--test-reporter=spec --test-reporter-destination="$report")
  [[ -n $name_pattern ]] && args+=(--test-name-pattern="$name_pattern")
  # timeout makes itself a process group leader: its pid names the group. The AWS SDK's own
  # switch silences its notice that later releases need a newer Node: noise in every S3 test.
  AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED=true \
    timeout --kill-after=30s "${limit_s}s" node "${args[@]}" "$file" &
  current_group=$!
  wait "$current_group"
  rc=$?
  sweep_group "$current_group"
  current_group=""
  # The runner's closing "# pass N" / "# fail N" / "# cancelled N" lines. Skips are counted
  # from the "ok N - name # SKIP reason" lines: "# skipped N" leaves out skipped suites.
  local pass fail cancelled skip native_skip pyref_skip llamacpp_skip
  pass="$(sed -n 's/^# pass \([0-9]*\)$/\1/p' "$tap" | tail -n 1)"
  fail="$(sed -n 's/^# fail \([0-9]*\)$/\1/p' "$tap" | tail -n 1)"
  cancelled="$(sed -n 's/^# cancelled \([0-9]*\)$/\1/p' "$tap" | tail -n 1)"
  skip="$(grep -cE '^[[:space:]]*ok [0-9]+ - .* # SKIP' "$tap")"
  native_skip="$(grep -cE "^[[:space:]]*ok [0-9]+ - .* # SKIP $native_skip_reason" "$tap")"
  pyref_skip="$(grep -cE "^[[:space:]]*ok [0-9]+ - .* # SKIP $pyref_skip_reason" "$tap")"
  llamacpp_skip="$(grep -cE "^[[:space:]]*ok [0-9]+ - .* # SKIP $llamacpp_skip_reason" "$tap")"
  rm -f "$tap"
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    node_failed=$((node_failed + 1))
    note_file "$file: killed after ${limit_s}s"
    keep_failure_report "$file" "$report"
    rm -f "$report"
    return
  fi
  if [[ -z $pass ]]; then
    node_failed=$((node_failed + 1))
    note_file "$file: no results (exit $rc)"
    keep_failure_report "$file" "$report"
    rm -f "$report"
    return
  fi
  local bad=$((${fail:-0} + ${cancelled:-0}))
  # A non-zero exit with no failed test: a crash in a hook, an unhandled error.
  if [[ $rc -ne 0 && $bad -eq 0 ]]; then
    bad=1
    note_file "$file: exit $rc with no failed test"
  fi
  [[ $bad -gt 0 ]] && keep_failure_report "$file" "$report"
  rm -f "$report"
  if [[ ${CI:-} == true && $native_skip -gt 0 ]]; then
    skip=$((skip - native_skip))
    bad=$((bad + native_skip))
    note_file "$file: $native_skip skipped for missing native tools (a failure with CI=true)"
  fi
  if [[ ${CI:-} == true && $pyref_skip -gt 0 ]]; then
    skip=$((skip - pyref_skip))
    bad=$((bad + pyref_skip))
    note_file "$file: $pyref_skip skipped for a missing Python reference (a failure with CI=true)"
  fi
  if [[ ${CI:-} == true && $llamacpp_skip -gt 0 ]]; then
    skip=$((skip - llamacpp_skip))
    bad=$((bad + llamacpp_skip))
    note_file "$file: $llamacpp_skip skipped for a missing llama.cpp build (a failure with CI=true)"
  fi
  node_passed=$((node_passed + pass))
  node_failed=$((node_failed + bad))
  node_skipped=$((node_skipped + skip))
}

# sweep_group <pgid>: SIGTERM what is left in the group, SIGKILL what survives 5 s.
sweep_group() {
  local group="$1"
  kill -TERM -- "-$group" 2>/dev/null || return 0
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    sleep 0.5
    kill -0 -- "-$group" 2>/dev/null || return 0
  done
  kill -KILL -- "-$group" 2>/dev/null || true
}

# run_node_suite <summary label> <compiled test file...>: the files one at a time, one summary
# line for them all.
run_node_suite() {
  local label="$1" file
  shift
  local files=("$@") missing=()
  for file in "${files[@]}"; do [[ -f $file ]] || missing+=("$file"); done
  if [[ ${#missing[@]} -gt 0 ]]; then
    echo "test.sh: not compiled (run without --skip-setup): ${missing[*]}" >&2
    fail_step "$label"
  elif [[ ${#files[@]} -eq 0 ]]; then
    record "$label" "no test files"
  else
    node_passed=0
    node_failed=0
    node_skipped=0
    node_file_notes=()
    for file in "${files[@]}"; do run_node_file "$file"; done
    passed=$((passed + node_passed))
    failed=$((failed + node_failed))
    skipped=$((skipped + node_skipped))
    record "$label" "$node_passed passed, $node_failed failed, $node_skipped skipped"
    summary+=("${node_file_notes[@]}")
  fi
}

# ---- set-up steps in the background ----
# start_builds <step...>: runs those scripts/setup.sh steps one after another in the background at
# a lower priority than the tests (whose timing they would otherwise stretch), each step's exit
# code to a file as it ends; sets builds_dir and builds_pid for await_build. Their output is
# kept and shown when a step is awaited.
start_builds() {
  builds_dir="$(mktemp -d)"
  (
    for step in "$@"; do
      nice -n 10 bash scripts/setup.sh "$step"
      echo $? >"$builds_dir/$step.rc"
    done
  ) >>"$builds_dir/output" 2>&1 &
  builds_pid=$!
}

# await_build <builds dir> <builds pid> <step> <summary label>: waits for that step of
# start_builds (nothing to wait for when the dir is empty: --skip-setup), shows what the builds
# said so far, and fails the label when the step did. Returns non-zero when it failed.
await_build() {
  local dir="$1" pid="$2" step="$3" label="$4"
  [[ -n $dir ]] || return 0
  while [[ ! -f $dir/$step.rc ]] && kill -0 "$pid" 2>/dev/null; do sleep 2; done
  cat "$dir/output"
  : >"$dir/output"
  [[ "$(cat "$dir/$step.rc" 2>/dev/null)" == 0 ]] && return 0
  fail_step "$label"
  return 1
}

# images_built <name>: the tests' scripts/build-image.sh calls take that image as built (set-up
# built it in the background): they must not queue behind the other image's build.
images_built() {
  [[ -n $image_builds ]] || return 0
  export MOERL_IMAGES_BUILT="${MOERL_IMAGES_BUILT:-} $1"
}

# stop_builds <builds dir> <builds pid>: waits for what is left and removes the folder.
stop_builds() {
  [[ -n $1 ]] || return 0
  wait "$2"
  cat "$1/output"
  rm -rf "$1"
}

# ---- the test cluster's lane ----
# cluster_lane: the Kubernetes tools (built when missing), then the test/k8s files: first those
# on the control plane alone, while the real node's images build in the background (they start
# with the tools: minutes the first time, much of it downloads), then those that start a real
# node (they use test/support/kube-node.ts or node-campaign.ts), the PyTorch node last, once its
# own image (about 7 GB) is built too.
cluster_lane() {
  local started=$SECONDS file plane_files=() node_files=() pytorch_files=()
  for file in "${cluster_files[@]}"; do
    if [[ $file == */pytorch-node.test.js ]]; then
      pytorch_files+=("$file")
    elif source_mentions "$file" "support/(kube-node|node-campaign)\\.js'"; then
      node_files+=("$file")
    else
      plane_files+=("$file")
    fi
  done
  image_builds=""
  image_builds_pid=""
  if [[ $skip_setup -eq 0 ]]; then
    section "setup (test cluster)"
    local image_steps=()
    [[ $((${#node_files[@]} + ${#pytorch_files[@]})) -gt 0 ]] && image_steps+=(image)
    [[ ${#pytorch_files[@]} -gt 0 ]] && image_steps+=(image-pytorch)
    if [[ ${#image_steps[@]} -gt 0 ]]; then
      start_builds "${image_steps[@]}"
      image_builds="$builds_dir" image_builds_pid="$builds_pid"
    fi
    if ! nice -n 10 bash scripts/setup.sh kube-tools; then
      fail_step "setup (test cluster)"
      [[ -n $image_builds ]] && kill_tree "$image_builds_pid" && stop_builds "$image_builds" "$image_builds_pid"
      return
    fi
  fi
  if [[ ${#plane_files[@]} -gt 0 ]]; then
    section "node tests (test cluster: control plane)"
    run_node_suite "node (k8s)" "${plane_files[@]}"
  fi
  if [[ ${#node_files[@]} -gt 0 ]]; then
    await_build "$image_builds" "$image_builds_pid" image "build image" && images_built moerl
    section "node tests (test cluster: a real node)"
    run_node_suite "node (k8s node)" "${node_files[@]}"
  fi
  if [[ ${#pytorch_files[@]} -gt 0 ]]; then
    await_build "$image_builds" "$image_builds_pid" image-pytorch "build image (pytorch)" &&
      images_built moerl-pytorch
    section "node tests (test cluster: the PyTorch node)"
    run_node_suite "node (k8s pytorch)" "${pytorch_files[@]}"
  fi
  stop_builds "$image_builds" "$image_builds_pid"
  image_builds=""
  echo "the test cluster's lane: done in $((SECONDS - started))s"
}

# source_mentions <compiled test file> <extended regex>: whether its TypeScript source matches.
source_mentions() { grep -qE "$2" "$(sed -E 's#^dist/(.*)\.js$#\1.ts#' <<<"$1")"; }

# kill_tree <pid>: SIGTERM to a process and everything under it (a background shell runs its
# trap only once its current command is done: a set-up step's builds get the signal themselves).
kill_tree() {
  local pids=("$1") i=0 child
  while [[ $i -lt ${#pids[@]} ]]; do
    for child in $(pgrep -P "${pids[$i]}"); do pids+=("$child"); done
    i=$((i + 1))
  done
  kill -TERM "${pids[@]}" 2>/dev/null
}

# In the background the lane keeps its own bookkeeping, from zero, in files the host lane adds in
# at the end.
lane_dir=""
lane_pid=""
# shellcheck disable=SC2317 # called by the lane's trap
on_lane_signal() {
  [[ -n ${current_group:-} ]] && sweep_group "$current_group"
  [[ -n ${image_builds:-} ]] && kill_tree "$image_builds_pid"
  exit 1
}
stop_cluster_lane() {
  kill_tree "$lane_pid"
  wait "$lane_pid"
  lane_pid=""
}
start_cluster_lane() {
  lane_dir="$(mktemp -d)"
  (
    trap on_lane_signal INT TERM
    passed=0 failed=0 skipped=0 summary=() failure_reports=()
    cluster_lane
    echo "$passed $failed $skipped" >"$lane_dir/counts"
    printf '%s\0' "${summary[@]}" >"$lane_dir/summary"
    [[ ${#failure_reports[@]} -eq 0 ]] || printf '%s\0' "${failure_reports[@]}" >"$lane_dir/failures"
  ) >"$lane_dir/output" 2>&1 &
  lane_pid=$!
  echo "test.sh: the test cluster's lane runs beside this one; its output follows"
}
join_cluster_lane() {
  wait "$lane_pid"
  lane_pid=""
  section "the test cluster's lane"
  cat "$lane_dir/output"
  if [[ ! -f $lane_dir/counts ]]; then
    fail_step "test cluster lane"
  else
    local lane_passed lane_failed lane_skipped lane_summary=() lane_failures=()
    read -r lane_passed lane_failed lane_skipped <"$lane_dir/counts"
    passed=$((passed + lane_passed))
    failed=$((failed + lane_failed))
    skipped=$((skipped + lane_skipped))
    mapfile -d '' -t lane_summary <"$lane_dir/summary"
    summary+=("${lane_summary[@]}")
    if [[ -f $lane_dir/failures ]]; then
      mapfile -d '' -t lane_failures <"$lane_dir/failures"
      failure_reports+=("${lane_failures[@]}")
    fi
  fi
  rm -rf "$lane_dir"
}

# ---- the node test files: the test cluster's (test/k8s) and the host's ----
host_files=()
cluster_files=()
if want node; then
  [[ ${#paths[@]} -eq 0 ]] && paths=(test)
  if ! listing="$(node_test_files "${paths[@]}")"; then
    fail_step node
    finish
  fi
  [[ -n $listing ]] && mapfile -t host_files < <(grep -v '^dist/test/k8s/' <<<"$listing")
  [[ -n $listing ]] && mapfile -t cluster_files < <(grep '^dist/test/k8s/' <<<"$listing")
  [[ -n $listing ]] || record node "no test files"
fi

# ---- setup: what both lanes need; each lane then sets up what only it needs ----
native_ok=1
native_asan_ok=1
if [[ $skip_setup -eq 0 ]]; then
  section "setup"
  base=(npm)
  { want native || [[ ${#cluster_files[@]} -gt 0 ]]; } && base=(packages "${base[@]}")
  # The Python reference: the host's transformers tests and the cluster's HF campaigns; the
  # OpenEnv servers of the agent tests; the Temporal cluster of the cluster tier.
  want node && base+=(tools temporal-cluster reward-python pyref openenv)
  want node-lts && ! want node && base+=(tools)
  if ! bash scripts/setup.sh "${base[@]}"; then
    fail_step setup
    finish
  fi
  if want node || want node-lts; then
    bash scripts/setup.sh ts || fail_step "build (tsc)"
  fi
  if want native && [[ $skip_native -eq 0 ]]; then
    bash scripts/setup.sh native || {
      native_ok=0
      fail_step "build native"
    }
  fi
fi

# ---- the two lanes ----
# The cluster lane goes to the background only when the host lane has work of its own, so that
# a run of test/k8s files alone shows its output as it comes.
if [[ ${#cluster_files[@]} -gt 0 ]]; then
  if want lint || want native || want node-lts || [[ ${#host_files[@]} -gt 0 ]]; then
    start_cluster_lane
  else
    cluster_lane
    finish
  fi
fi

# ---- the host's lane ----
# What only it needs set up builds in the background (llama.cpp, the ASan build, the Node.js
# LTS), while lint, ctest and the node test files that need none of it run; then the rest, each
# once its build is done.
host_builds=""
host_builds_pid=""
llamacpp_files=()
if want node; then
  mapfile -t llamacpp_files < <(for file in "${host_files[@]}"; do
    source_mentions "$file" "engines/llamacpp\\.js'" && echo "$file"
  done)
  mapfile -t host_files < <(for file in "${host_files[@]}"; do
    source_mentions "$file" "engines/llamacpp\\.js'" || echo "$file"
  done)
fi
if [[ $skip_setup -eq 0 ]]; then
  host_steps=()
  want node-lts && host_steps+=(node-lts)
  want native && [[ $skip_native -eq 0 ]] && host_steps+=(native-asan)
  [[ ${#llamacpp_files[@]} -gt 0 ]] && host_steps+=(llamacpp)
  if [[ ${#host_steps[@]} -gt 0 ]]; then
    start_builds "${host_steps[@]}"
    host_builds="$builds_dir" host_builds_pid="$builds_pid"
  fi
fi

if want lint; then
  section "lint"
  if npm run --silent lint; then
    record lint ok
  else
    fail_step lint
  fi
fi

if want native && [[ $skip_native -eq 1 ]]; then
  record native "skipped (MOERL_SKIP_NATIVE=1)"
elif want native; then
  if [[ $native_ok -eq 1 ]]; then run_ctest native/build "ctest"; else record ctest "not run (build failed)"; fi
fi

# tsc emits dist/ even when it reports type errors: the tests still run, and its failure is
# counted once, above.
if want node && [[ ${#host_files[@]} -gt 0 ]]; then
  section "node tests"
  run_node_suite node "${host_files[@]}"
fi

if want native && [[ $skip_native -eq 0 ]]; then
  if await_build "$host_builds" "$host_builds_pid" native-asan "build native-asan"; then
    run_ctest native/build-asan "ctest (asan)"
  else
    record "ctest (asan)" "not run (build failed)"
  fi
fi

if [[ ${#llamacpp_files[@]} -gt 0 ]]; then
  await_build "$host_builds" "$host_builds_pid" llamacpp "setup (llama.cpp)"
  section "node tests (llama.cpp)"
  run_node_suite "node (llama.cpp)" "${llamacpp_files[@]}"
fi

# The image ships the current LTS; the machine's Node runs everything above. The workers and
# CLIs the tests start run on the test's own Node (process.execPath) or the first on PATH.
if want node-lts && await_build "$host_builds" "$host_builds_pid" node-lts "setup (node-lts)"; then
  if lts="$(bash scripts/node-lts.sh)"; then
    section "node tests on Node.js $("$lts" --version)"
    mapfile -t lts_files < <(node_test_files test/unit test/integration/campaign.test.ts)
    PATH="$(dirname "$lts"):$PATH" run_node_suite "node-lts" "${lts_files[@]}"
  else
    fail_step node-lts
  fi
fi
stop_builds "$host_builds" "$host_builds_pid"
host_builds=""

[[ -n $lane_pid ]] && join_cluster_lane
finish
