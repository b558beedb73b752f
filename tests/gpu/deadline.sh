#!/usr/bin/env bash
# tests/gpu/deadline.sh — checks, without a GPU, how tests/gpu/run.sh
# chooses its steps and keeps to its deadline (tests/gpu/lib.sh), on a
# stand-in machine: a copy of the scripts in a scratch checkout whose
# build-gpu/ holds a stub `kiln`, and stubs for nvidia-smi and ctest first
# on PATH, with empty lib{cudart,cublasLt,nccl}.so for the preflight.
#   (a) gpu_plan, gpu_budget and gpu_window (the steps' shares) on their
#       own, with a fixed clock;
#   (b) bad arguments: exit status 2 and one line naming the bad word;
#   (c) `kernels,fashion --deadline 14` (a 2 s reserve, every step's least
#       time 3 s): ctest passes, the first Fashion-MNIST run (its stub
#       sleeps 60 s) is cut by its time limit, which the deadline had cut,
#       and recorded as skipped for the deadline, as are the rest,
#       results.json is written before the deadline and the exit status is
#       3 (none failed, the deadline cut some);
#   (d) `kernels,fashion` with no deadline, the stub's fits quick: passes,
#       exit status 0, OUT holds gpu.log, results.json and logs.tar.xz
#       alone, and logs.tar.xz holds the fits' metrics.csv but no token
#       shard or checkpoint; the precisions match fp32's accuracy, and
#   (d2) a bf16 accuracy 0.03 under fp32's (still above 0.80) fails that
#       comparison, naming bf16;
#   (e) `kernels,fashion --deadline 24`, ctest's stub sleeping 60 s: ctest
#       is cut at the kernels step's share (skipped for the deadline), and
#       the first fit still starts;
#   (j) `sanitizers --deadline 20`, compute-sanitizer's stub sleeping 60 s
#       (and reporting a race first under racecheck): memcheck is skipped
#       as timed out, not failed; the racecheck that reported a race before
#       its limit fails;
#   (k) bench/gpu/gpt2.sh with 15 s to its deadline, kiln's stub sleeping
#       60 s: the batch-64 run, cut by its limit, stops the batch search
#       (no batch-32 run) with one skip row, and its log is kept in
#       OUT/bench_gpt2/ (no token shard);
#   (l) tests/gpu/gpt_checks.sh with 12 s to its deadline, kiln's stub
#       sleeping 60 s in the fortunes runs only: the first is cut by the
#       deadline, the others are left out, and gpt_fortunes is a skip for
#       the deadline, not a failure;
#   (m) a build recording a checkout path that cannot be created here
#       (under /proc): the run goes on with the build in this checkout, its
#       CTest files rewritten to it, with a line that says so;
#   (f)-(i) stops before any check, each with one line and exit status 1:
#       a library `ldd` does not find, a plugin `kiln plugins list`
#       refuses, a list without the cuda accelerator that names
#       libkiln-cuda.so elsewhere, and carried libraries that do not unpack.
# Exit 0 when all hold, 77 (skipped) without python3 or timeout here.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
command -v python3 >/dev/null && command -v timeout >/dev/null || { echo "deadline.sh: needs python3 and timeout: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "deadline.sh: FAIL: $*"; exit 1; }

# ---- (a) the library ------------------------------------------------------------
(
  . "$here/lib.sh"
  [ "$(gpu_plan all)" = "kernels gpt fashion gpt2 sanitizers bench" ] || fail "(a) plan all: $(gpu_plan all)"
  [ "$(gpu_plan core)" = "kernels fashion sanitizers bench" ] || fail "(a) plan core: $(gpu_plan core)"
  [ "$(gpu_plan transformer)" = "gpt gpt2" ] || fail "(a) plan transformer: $(gpu_plan transformer)"
  [ "$(gpu_plan bench,gpt,kernels)" = "kernels gpt bench" ] || fail "(a) plan bench,gpt,kernels: $(gpu_plan bench,gpt,kernels)"
  [ "$(gpu_plan transformer,gpt)" = "gpt gpt2" ] || fail "(a) a step named twice runs once"
  msg=$(gpu_plan kernels,gpu 2>&1) && fail "(a) an unknown step was accepted"
  grep -q "unknown step 'gpu'" <<<"$msg" || fail "(a) the refusal does not name the step: $msg"
  KILN_GPU_DEADLINE=0
  [ "$(gpu_budget 300 30)" = 300 ] || fail "(a) no deadline: the step's own limit"
  KILN_GPU_DEADLINE=1000 KILN_GPU_TEST_NOW=800 KILN_GPU_RESERVE=15
  [ "$(gpu_budget 300 30)" = 185 ] || fail "(a) 200 s left, 15 reserved: $(gpu_budget 300 30), want 185"
  [ "$(gpu_budget 100 30)" = 100 ] || fail "(a) a limit under what is left stays"
  KILN_GPU_TEST_NOW=960
  gpu_budget 300 30 >/dev/null && fail "(a) 25 s left for a step needing 30 was granted"
  KILN_GPU_TEST_NOW=1100
  gpu_budget 300 1 >/dev/null && fail "(a) past the deadline a step was granted time"
  grep -q '"why": "the deadline: -100 s left"' <<<"$(gpu_skip_why)" || fail "(a) skip line: $(gpu_skip_why)"
  KILN_GPU_TEST_NOW=800
  [ "$(gpu_budget 300 30 50)" = 135 ] || fail "(a) 200 s left, 15 reserved, 50 held: $(gpu_budget 300 30 50), want 135"
  [ "$(gpu_budget 300 150 50)" = 150 ] || fail "(a) the time held gives way to the least time: $(gpu_budget 300 150 50), want 150"
  gpu_budget 300 186 50 >/dev/null && fail "(a) 185 s left for a step needing 186 was granted"
  # the shares: with 570 s (555 after the reserve) each step of `all` gets
  # its weight, the last all that is left; without a deadline no share
  KILN_GPU_TEST_NOW=430
  [ "$(gpu_window kernels gpt fashion gpt2 sanitizers bench)" = $((430 + 60 + 15)) ] ||
    fail "(a) kernels' share of 570 s: $(($(gpu_window kernels gpt fashion gpt2 sanitizers bench) - 445)), want 60"
  [ "$(gpu_window gpt fashion gpt2 sanitizers bench)" = $((430 + 555 * 140 / 495 + 15)) ] || fail "(a) gpt's share after an early kernels step"
  [ "$(gpu_window bench)" = 1000 ] || fail "(a) the last step gets all that is left"
  # 200 s left for all six: kernels gets its least (30), not 200 * 60 / 555,
  # and the later steps keep theirs as far as they fit in order (gpt 60,
  # fashion 20, gpt2 60: 140, not sanitizers' 45)
  KILN_GPU_TEST_NOW=785
  [ "$(gpu_window kernels gpt fashion gpt2 sanitizers bench)" = $((785 + 30 + 15)) ] || fail "(a) kernels' least time"
  # 150 s left for the last three: gpt2's share (150 * 120 / 265 = 67) would
  # leave sanitizers and bench under their 45 + 40: it gets 65
  KILN_GPU_TEST_NOW=835
  [ "$(gpu_window gpt2 sanitizers bench)" = $((835 + 65 + 15)) ] || fail "(a) gpt2 leaves sanitizers and bench their least"
  KILN_GPU_DEADLINE=0
  [ "$(gpu_window kernels gpt)" = 0 ] || fail "(a) a share without a deadline"
  exit 0
) || exit 1

# ---- the stand-in machine ---------------------------------------------------------
root="$tmp/root"
mkdir -p "$root/tests/gpu" "$root/build-gpu/bin" "$root/.gpu/fashion-mnist" "$tmp/stubs" "$tmp/lib"
cp "$here/run.sh" "$here/lib.sh" "$root/tests/gpu/"
echo "CMAKE_HOME_DIRECTORY:INTERNAL=$root" >"$root/build-gpu/CMakeCache.txt"
: >"$root/.gpu/fashion-mnist/train-images-idx3-ubyte.gz"
. "$here/standin.sh"
standin_libs "$tmp/lib"
standin_driver "$tmp/stubs"
# the stub kiln: `plugins list` prints STUB_PLUGINS (a file) or a list with
# the cuda accelerator; `fit` sleeps 60 s, or with STUB_FIT=quick writes a
# metrics.csv, a checkpoint and a token shard under its default_root_dir
# and reports a test accuracy (0.85; STUB_BF16_ACC for bf16-mixed)
cat >"$root/build-gpu/bin/kiln" <<'SH'
#!/bin/sh
case "$1" in
  plugins)
    if [ -n "${STUB_PLUGINS:-}" ]; then cat "$STUB_PLUGINS"; else printf 'plugins:\n  accelerator  cuda  (stub)\n'; fi ;;
  fit)
    [ "${STUB_FIT:-}" = quick ] || { sleep 60; exit 0; }
    acc=0.85
    for a in "$@"; do
      case "$a" in
        trainer.default_root_dir=*) d=${a#trainer.default_root_dir=} ;;
        precision=bf16-mixed) acc=${STUB_BF16_ACC:-0.85} ;;
      esac
    done
    mkdir -p "$d/version_0/checkpoints"
    printf 'epoch,val_loss\n1,0.5\n' >"$d/version_0/metrics.csv"
    echo weights >"$d/version_0/checkpoints/last.safetensors"
    echo tokens >"$d/shard.bin"
    echo "test_acc $acc (1000 samples/s)" ;;
esac
SH
printf '#!/bin/sh\nsleep "${STUB_CTEST_SLEEP:-1}"\n' >"$tmp/stubs/ctest"
chmod +x "$root/build-gpu/bin/kiln" "$tmp/stubs/"*
run() { # OUT ARGS...: run.sh on the stand-in machine
  local o=$1
  shift
  PATH="$tmp/stubs:$PATH" LD_LIBRARY_PATH="$tmp/lib" KILN_GPU_RESERVE=2 KILN_GPU_TEST_MIN=3 \
    timeout 60 bash "$root/tests/gpu/run.sh" "$tmp/$o" "$@" >"$tmp/$o.txt" 2>&1
}

# ---- (b) bad arguments ------------------------------------------------------------
run b1 kernels,gpu; rc=$?
[ "$rc" -eq 2 ] || { cat "$tmp/b1.txt"; fail "(b) unknown step: exit status $rc, want 2"; }
grep -q "unknown step 'gpu'" "$tmp/b1.txt" || fail "(b) the refusal does not name the step"
run b2 kernels --deadline 5m; rc=$?
[ "$rc" -eq 2 ] || fail "(b) --deadline 5m: exit status $rc, want 2"
grep -q "whole number of seconds, got '5m'" "$tmp/b2.txt" || { cat "$tmp/b2.txt"; fail "(b) the refusal does not name the value"; }

# ---- (c) a deadline that cuts -------------------------------------------------------
t0=$(date +%s)
run c kernels,fashion --deadline 14; rc=$?
took=$(($(date +%s) - t0))
cat "$tmp/c.txt"
[ "$rc" -eq 3 ] || fail "(c) exit status $rc, want 3 (the deadline cut checks, none failed)"
[ "$took" -le 16 ] || fail "(c) took $took s with a 14 s deadline"
python3 - "$tmp/c/results.json" <<'PY' || fail "(c) results.json"
import json, sys
r = json.load(open(sys.argv[1]))
by = {row["check"]: row for row in r["results"]}
assert r["steps"] == ["kernels", "fashion"], r["steps"]
assert by["ctest_gpu"]["status"] == "pass", by["ctest_gpu"]
# fit_fp32 started (its stub sleeps 60 s) and its limit, cut by the
# deadline, ended it: a skip, not a failure; the later fits did not start
assert by["fit_fp32"]["status"] == "skip" and by["fit_fp32"]["why"].startswith("the deadline: cut at"), by["fit_fp32"]
skipped = [c for c, row in by.items() if row["status"] == "skip" and row.get("why", "").startswith("the deadline")]
assert "fit_bf16" in skipped and by["fit_bf16"]["why"].endswith("s left"), by
assert r["cut_by_deadline"] == len(skipped) >= 2, r
assert r["failures"] == 0, r
PY
grep -q "steps: kernels fashion; the deadline in" "$tmp/c.txt" || fail "(c) no line naming the steps and the deadline"

# ---- (d) no deadline ----------------------------------------------------------------
STUB_FIT=quick run d kernels,fashion; rc=$?
[ "$rc" -eq 0 ] || { cat "$tmp/d.txt"; fail "(d) exit status $rc, want 0"; }
grep -q '"cut_by_deadline": 0' "$tmp/d/results.json" || fail "(d) cut_by_deadline not 0"
# OUT holds three files (a device tool brings back only a few), the logs packed
[ "$(cd "$tmp/d" && ls -A | tr '\n' ' ')" = "gpu.log logs.tar.xz results.json " ] || fail "(d) OUT holds: $(ls -A "$tmp/d")"
# (the listing goes to a file: under pipefail, grep -q leaving early can
# kill tar with SIGPIPE and fail the check at random)
tar -tJf "$tmp/d/logs.tar.xz" >"$tmp/d.list" || fail "(d) logs.tar.xz does not list"
grep -q 'plugins.txt$' "$tmp/d.list" || fail "(d) logs.tar.xz lacks plugins.txt"
grep -q '^runs_fp32/version_0/metrics.csv$' "$tmp/d.list" || { cat "$tmp/d.list"; fail "(d) logs.tar.xz lacks the fits' metrics.csv"; }
grep -q -E '\.bin$|\.safetensors$' "$tmp/d.list" && { cat "$tmp/d.list"; fail "(d) logs.tar.xz packs a token shard or a checkpoint"; }

row() { # RESULTS CHECK: "status why" of that row
  python3 -c 'import json, sys
r = {x["check"]: x for x in json.load(open(sys.argv[1]))["results"]}.get(sys.argv[2], {})
print(r.get("status", "none"), r.get("why", ""))' "$1" "$2"
}
[ "$(row "$tmp/d/results.json" fashion_vs_fp32)" = "pass " ] ||
  fail "(d) the precisions against fp32: $(row "$tmp/d/results.json" fashion_vs_fp32), want pass"
# a precision that learns clearly less than fp32 (0.82 against 0.85 for
# bf16, whose margin is 0.015) fails the comparison, though above 0.80
STUB_FIT=quick STUB_BF16_ACC=0.82 run d2 fashion; rc=$?
[ "$rc" -eq 1 ] || { cat "$tmp/d2.txt"; fail "(d2) exit status $rc, want 1"; }
[ "$(row "$tmp/d2/results.json" fit_bf16)" = "pass " ] || fail "(d2) fit_bf16 itself should pass (0.82 >= 0.80)"
[ "$(row "$tmp/d2/results.json" fashion_vs_fp32)" = "fail more than its margin below fp32: bf16" ] ||
  fail "(d2) the comparison: $(row "$tmp/d2/results.json" fashion_vs_fp32), want a failure naming bf16"

# ---- (e) the kernels step's share ------------------------------------------------------
STUB_CTEST_SLEEP=60 run e kernels,fashion --deadline 24; rc=$?
cat "$tmp/e.txt"
python3 - "$tmp/e/results.json" <<'PY' || fail "(e) results.json"
import json, sys
by = {row["check"]: row for row in json.load(open(sys.argv[1]))["results"]}
# ctest was cut at the kernels step's share, and fashion still had time to start a fit
assert by["ctest_gpu"]["status"] == "skip" and by["ctest_gpu"]["why"].startswith("the deadline: cut at"), by["ctest_gpu"]
assert by["fit_fp32"]["why"].startswith("the deadline: cut at"), by["fit_fp32"]
PY

# ---- (j) a sanitizer its time limit stops ---------------------------------------------------
mkdir -p "$root/build-gpu/tests"
printf '#!/bin/sh\nexit 0\n' >"$root/build-gpu/tests/test_cuda_kernels"
cat >"$tmp/stubs/compute-sanitizer" <<'SH'
#!/bin/sh
echo "========= COMPUTE-SANITIZER"
[ "$2" = racecheck ] && echo "========= Error: Race reported between Write access at kg_flash_fwd+0x100 and Read access at kg_flash_fwd+0x200"
sleep 60
SH
chmod +x "$root/build-gpu/tests/test_cuda_kernels" "$tmp/stubs/compute-sanitizer"
run j sanitizers --deadline 20; rc=$?
cat "$tmp/j.txt"
[ "$rc" -eq 1 ] || fail "(j) exit status $rc, want 1 (the race reported)"
python3 - "$tmp/j/results.json" <<'PY' || fail "(j) results.json"
import json, sys
r = json.load(open(sys.argv[1]))
by = {row["check"]: row for row in r["results"]}
assert by["memcheck"]["status"] == "skip" and by["memcheck"]["why"].startswith("timed out after"), by["memcheck"]
assert by["flash_racecheck"]["status"] == "fail" and "having reported errors" in by["flash_racecheck"]["why"], by["flash_racecheck"]
assert r["failures"] == 1 and r["cut_by_deadline"] >= 1, r
PY
rm -rf "$root/build-gpu/tests" "$tmp/stubs/compute-sanitizer"

# ---- (k) gpt2.sh: a batch run cut by its limit stops the search --------------------------
mkdir -p "$root/bench/gpu"
cp "$here/../../bench/gpu/gpt2.sh" "$root/bench/gpu/"
cp "$here/synthetic_shard.py" "$root/tests/gpu/"
PATH="$tmp/stubs:$PATH" KILN_GPU_DEADLINE=$(($(date +%s) + 15)) KILN_GPU_RESERVE=2 KILN_GPU_TEST_MIN=3 \
  timeout 60 bash "$root/bench/gpu/gpt2.sh" "$root/build-gpu" "$tmp/k" >"$tmp/k.txt" 2>&1; rc=$?
cat "$tmp/k.txt"
[ "$rc" -eq 0 ] || fail "(k) exit status $rc, want 0 (the deadline cut the search: a skip)"
python3 - "$tmp/k/bench_gpt2.jsonl" <<'PY' || fail "(k) bench_gpt2.jsonl"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 1 and rows[0]["status"] == "skip" and rows[0]["batch"] == 64, rows
assert rows[0]["why"].startswith("the deadline: batch 64 cut at"), rows
PY
[ -f "$tmp/k/bench_gpt2/b64.log" ] || fail "(k) the batch-64 run's log was not kept"
[ -e "$tmp/k/bench_gpt2/b32.log" ] && fail "(k) the search went on to batch 32 after a run its limit ended"
compgen -G "$tmp/k/bench_gpt2/*.bin" >/dev/null && fail "(k) the token shard was kept"

# ---- (l) gpt_checks.sh: fortunes runs the deadline cuts ---------------------------------
cp "$here/gpt_checks.sh" "$root/tests/gpu/"
mkdir -p "$tmp/fortunes" "$tmp/lstub/build/bin"
printf 'A fortune.\n%%\nAnother one.\n' >"$tmp/fortunes/fortunes"
cat >"$tmp/lstub/build/bin/kiln" <<'SH'
#!/bin/sh
# fit: the fortunes demo sleeps 60 s, every other run ends at once
case "$2" in *gpt_fortunes.cfg) sleep 60 ;; esac
exit 0
SH
chmod +x "$tmp/lstub/build/bin/kiln"
PATH="$tmp/stubs:$PATH" KILN_FORTUNES_DIR="$tmp/fortunes" KILN_GPU_DEADLINE=$(($(date +%s) + 12)) KILN_GPU_RESERVE=2 \
  KILN_GPU_TEST_MIN=3 timeout 60 bash "$root/tests/gpu/gpt_checks.sh" "$tmp/lstub/build" "$tmp/l" >"$tmp/l.txt" 2>&1
cat "$tmp/l.txt"
python3 - "$tmp/l/gpt.jsonl" <<'PY' || fail "(l) gpt.jsonl"
import json, sys
by = {r["check"]: r for r in map(json.loads, open(sys.argv[1]))}
f = by["gpt_fortunes"]
assert f["status"] == "skip" and f["why"].startswith("the deadline"), f
assert f["val_loss_fp32"] == "not run", f
PY
grep -q "fortunes 32-true: cut by the deadline at" "$tmp/l.txt" || fail "(l) the first fortunes run was not cut by the deadline"

# ---- (m) a recorded path that cannot be linked ---------------------------------------------
gone=/proc/kiln-no-such-folder/checkout
echo "CMAKE_HOME_DIRECTORY:INTERNAL=$gone" >"$root/build-gpu/CMakeCache.txt"
echo "add_test([=[test_cuda_kernels]=] \"$gone/build-gpu/tests/test_cuda_kernels\")" >"$root/build-gpu/CTestTestfile.cmake"
STUB_FIT=quick run m kernels; rc=$?
[ "$rc" -eq 0 ] || { cat "$tmp/m.txt"; fail "(m) exit status $rc, want 0"; }
grep -q -F -- "-- note: the build records $gone, which cannot be linked to $root here: its CTest files are rewritten to $root" \
  "$tmp/m.txt" || { cat "$tmp/m.txt"; fail "(m) no line on the rewritten CTest files"; }
grep -q -F "\"$root/build-gpu/tests/test_cuda_kernels\"" "$root/build-gpu/CTestTestfile.cmake" ||
  fail "(m) the CTest file was not rewritten: $(cat "$root/build-gpu/CTestTestfile.cmake")"
grep -q -F -- "-- build: pass \"from\": \"carried $root/build-gpu\"" "$tmp/m.txt" ||
  fail "(m) the run did not use the build in $root"
echo "CMAKE_HOME_DIRECTORY:INTERNAL=$root" >"$root/build-gpu/CMakeCache.txt"
rm "$root/build-gpu/CTestTestfile.cmake"

# ---- (f)-(i) stops before any check ------------------------------------------------------
# stopped NAME WHAT LINE: run NAME stopped before any check with LINE
stopped() {
  local rc=$1 name=$2 line=$3
  [ "$rc" -eq 1 ] || { cat "$tmp/$name.txt"; fail "($name) exit status $rc, want 1"; }
  grep -q -F "run.sh: stopping before any check: $line" "$tmp/$name.txt" || { cat "$tmp/$name.txt"; fail "($name) no line: $line"; }
  grep -q -E '^== (GPU tests|fit )' "$tmp/$name.txt" && fail "($name) a check ran after the stop"
  [ -f "$tmp/$name/results.json" ] || fail "($name) no results.json"
}
# (f) ldd finds a library missing
mkdir -p "$tmp/lddstub"
printf '#!/bin/sh\nprintf "\\tlibconfig.so.11 => not found\\n\\tlibc.so.6 => /lib/libc.so.6 (0x00007f)\\n"\n' >"$tmp/lddstub/ldd"
chmod +x "$tmp/lddstub/ldd"
PATH="$tmp/lddstub:$PATH" run f kernels; stopped $? f "bin/kiln cannot load: libconfig.so.11 => not found"
# (g) a refused plugin
printf 'refused (1; --verbose shows every candidate):\n  %s: plugin directory is group-writable (mode 0775), expected writable by its owner only\nplugins:\n  accelerator  cuda  (stub)\n' \
  "$root/build-gpu/lib/kiln/plugins" >"$tmp/plugins-g"
STUB_PLUGINS="$tmp/plugins-g" run g kernels; stopped $? g "kiln refused a plugin: $root/build-gpu/lib/kiln/plugins: plugin directory is group-writable"
grep -q "permissions on the GPU machine were not known beforehand" "$tmp/g.txt" || fail "(g) the line does not say the permissions were unknown"
# (h) no cuda accelerator, though a line names libkiln-cuda.so
printf 'plugins:\n  accelerator  cpu  (stub)\nwarnings:\n  %s/libkiln-cuda.so: cuda accelerator probe slow\n' "$root/build-gpu/lib/kiln/plugins" >"$tmp/plugins-h"
STUB_PLUGINS="$tmp/plugins-h" run h kernels; stopped $? h "kiln plugins list does not list the cuda accelerator"
# (i) carried libraries that do not unpack
echo "not a tar file" >"$root/.gpu/deps.tar.xz"
run i kernels; stopped $? i "could not unpack $root/.gpu/deps.tar.xz"
rm "$root/.gpu/deps.tar.xz"
echo "deadline.sh: ok"
