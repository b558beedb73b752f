#!/usr/bin/env bash
# tests/fuzz/run.sh — build kiln's libFuzzer targets with clang and run each
# for a fixed time: the CI step (.ci/setup.sh test) and the way to fuzz
# longer by hand.
#
#   tests/fuzz/run.sh                      every target, 25 s each, 2 at a time
#   tests/fuzz/run.sh --seconds 600 safetensors idx_raw
#   tests/fuzz/run.sh --jobs 1 --build /tmp/bf
#   tests/fuzz/run.sh --no-build --seconds 3600 config   (beside another run)
#   tests/fuzz/run.sh --runs 10000000 --seconds 9000 config   (stop at 10 M)
#   tests/fuzz/run.sh --no-leaks ...   (leak detection off; see below)
#
# Builds into build-fuzz/ (clang, -DKILN_FUZZ=ON; only the fuzz targets are
# built). Each target starts from tests/fuzz/<t>/seeds and
# tests/fuzz/<t>/regressions with tests/fuzz/<t>/<t>.dict; what it learns
# goes to build-fuzz/fuzz-corpus/<t> (kept between runs, so a long run
# resumes where the last stopped). A finding (crash, sanitizer report, leak,
# timeout, out-of-memory) is written to build-fuzz/fuzz-findings/<t>/ and
# makes the script exit 1; save it as tests/fuzz/<t>/regressions/<name> with
# the fix, and fuzz_replay_<t> (CTest) replays it in every build from then
# on. --no-leaks turns LeakSanitizer off for long runs of `config`:
# libconfig's lexer leaks its string buffer on every unterminated string
# (a suppressed leak, tests/fuzz/lsan.supp), and libFuzzer stops the world
# for a leak check after each such input, which cuts the rate to a tenth.
# Prints each target's executions, rate and result. Exits 0 without
# fuzzing (saying so) when clang is absent; exits 1 when clang is present but
# cannot link a libFuzzer program (Debian: install libclang-rt-14-dev).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
seconds=25
runs=-1
leaks=1
jobs=2
build="$root/build-fuzz"
do_build=1
targets=()
while (($#)); do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --no-leaks) leaks=0; shift ;;
    --jobs) jobs=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    -*) echo "run.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
all=(safetensors ckpt_meta config idx_raw idx_gzip tokens state ddp_hello)
explicit=${#targets[@]}
((explicit)) || targets=("${all[@]}")

cc=${CC:-clang}
if ! command -v "$cc" >/dev/null 2>&1; then
  echo "fuzz: no clang ($cc) on this machine: libFuzzer targets skipped (the replay tests still run under CTest)"
  exit 0
fi
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' \
  > "$probe/p.c"
if ! "$cc" -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" 2>"$probe/err"; then
  echo "fuzz: $cc cannot link a libFuzzer program (the fuzzer runtime is missing; Debian: apt-get install libclang-rt-14-dev):" >&2
  head -3 "$probe/err" >&2
  exit 1
fi

mkdir -p "$build/fuzz-logs"
if ((do_build)); then
echo "== fuzz: building the targets with $cc ($build)"
cmake -S "$root" -B "$build" -DCMAKE_C_COMPILER="$cc" -DKILN_FUZZ=ON -DKILN_ENABLE_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build/fuzz-logs/configure.log" 2>&1 || { cat "$build/fuzz-logs/configure.log" >&2; exit 1; }
build_targets=()
for t in "${targets[@]}"; do
  # a default run asks for ddp_hello only where CMake made the target
  if [ "$t" = ddp_hello ] && ((!explicit)) && ! grep -q "fuzz_ddp_hello" "$build/Makefile" 2>/dev/null; then continue; fi
  build_targets+=("fuzz_$t")
done
cmake --build "$build" -j "$jobs" --target "${build_targets[@]}" >"$build/fuzz-logs/build.log" 2>&1 ||
  { tail -30 "$build/fuzz-logs/build.log" >&2; exit 1; }
fi
# ddp_hello exists where CMake found libcrypto (the ddp plugin's): without
# it, the default list goes on without that target
if ((!explicit)) && [ ! -x "$build/tests/fuzz/fuzz_ddp_hello" ]; then
  echo "fuzz: no fuzz_ddp_hello (libcrypto not found): skipped"
  targets=("${targets[@]/ddp_hello/}")
fi

# one target: fuzz for $seconds, then report from libFuzzer's final stats
fuzz_one() {
  local t=$1 corpus="$build/fuzz-corpus/$1" found="$build/fuzz-findings/$1" log="$build/fuzz-logs/$1.log"
  rm -rf "$found" # findings of an earlier run: in its log, or saved as regressions
  mkdir -p "$corpus" "$found" "$(dirname "$log")"
  local dict=()
  [ -f "$here/$t/$t.dict" ] && dict=(-dict="$here/$t/$t.dict")
  local rc=0
  # leaks are findings too; -timeout: one input taking 10 s is a hang
  ASAN_OPTIONS=detect_leaks=$leaks:abort_on_error=0 LSAN_OPTIONS=suppressions="$here/lsan.supp" \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$build/tests/fuzz/fuzz_$t" -max_total_time="$seconds" -runs="$runs" -detect_leaks="$leaks" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$found/" "${dict[@]}" "$corpus" "$here/$t/seeds" "$here/$t/regressions" >"$log" 2>&1 || rc=$?
  local execs rate
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  if ((rc == 0)); then
    printf 'fuzz %-12s %12s execs %8s/s  %5s corpus  ok\n' "$t" "${execs:-?}" "${rate:-?}" "$(ls "$corpus" | wc -l)"
  else
    printf 'fuzz %-12s %12s execs  FINDING (exit %d): %s\n' "$t" "${execs:-?}" "$rc" "$(ls "$found" | tr '\n' ' ')"
    grep -m1 -E "ERROR: |runtime error|invariant broken|==ERROR" "$log" || tail -5 "$log"
    echo "  log: $log"
  fi
  return $rc
}

if ((runs >= 0)); then
  echo "== fuzz: ${targets[*]}: $runs executions or $seconds s each, whichever comes first, $jobs at a time"
else
  echo "== fuzz: ${targets[*]}: $seconds s each, $jobs at a time"
fi
failed=0
pids=()
names=()
for t in "${targets[@]}"; do
  [ -n "$t" ] || continue
  fuzz_one "$t" &
  pids+=($!)
  names+=("$t")
  if ((${#pids[@]} >= jobs)); then
    wait "${pids[0]}" || failed=1
    pids=("${pids[@]:1}")
    names=("${names[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
if ((failed)); then
  echo "== fuzz: findings; see above (inputs under $build/fuzz-findings)" >&2
  exit 1
fi
echo "== fuzz: no findings"
