#!/usr/bin/env bash
# tests/gpu/deadline.sh — checks, without a GPU, how tests/gpu/run.sh
# chooses its steps and keeps to its deadline (tests/gpu/lib.sh), on a
# stand-in machine: a copy of the scripts in a scratch checkout whose
# build-gpu/ holds a stub `kiln`, and stubs for nvidia-smi and ctest first
# on PATH, with empty lib{cudart,cublasLt,nccl}.so for the preflight.
#   (a) gpu_plan and gpu_budget on their own, with a fixed clock;
#   (b) bad arguments: exit status 2 and one line naming the bad word;
#   (c) `kernels,fashion --deadline 14` (a 2 s reserve, every step's least
#       time 3 s): ctest passes, the first Fashion-MNIST run (its stub
#       sleeps 60 s) is cut by its time limit and recorded as timed out, the
#       rest are recorded as skipped for the deadline, results.json is
#       written before the deadline and the exit status is 1;
#   (d) `kernels` with no deadline: passes, exit status 0, and OUT holds
#       gpu.log, results.json and logs.tar.xz alone.
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
  [ "$(gpu_plan all)" = "kernels gpt gpt2 fashion sanitizers bench" ] || fail "(a) plan all: $(gpu_plan all)"
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
cat >"$root/build-gpu/bin/kiln" <<'SH'
#!/bin/sh
case "$1" in
  plugins) echo "  accelerator  cuda  (stub)" ;;
  fit) sleep 60 ;;
esac
SH
printf '#!/bin/sh\nsleep 1\n' >"$tmp/stubs/ctest"
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
[ "$rc" -eq 1 ] || fail "(c) exit status $rc, want 1 (a run timed out)"
[ "$took" -le 16 ] || fail "(c) took $took s with a 14 s deadline"
python3 - "$tmp/c/results.json" <<'PY' || fail "(c) results.json"
import json, sys
r = json.load(open(sys.argv[1]))
by = {row["check"]: row for row in r["results"]}
assert r["steps"] == ["kernels", "fashion"], r["steps"]
assert by["ctest_gpu"]["status"] == "pass", by["ctest_gpu"]
assert by["fit_fp32"]["status"] == "fail" and by["fit_fp32"]["why"].startswith("timed out after"), by["fit_fp32"]
skipped = [c for c, row in by.items() if row["status"] == "skip" and row.get("why", "").startswith("the deadline")]
assert "fit_bf16" in skipped, by
assert r["cut_by_deadline"] == len(skipped) >= 1, r
assert r["failures"] == 1, r
PY
grep -q "steps: kernels fashion; the deadline in" "$tmp/c.txt" || fail "(c) no line naming the steps and the deadline"

# ---- (d) no deadline ----------------------------------------------------------------
run d kernels; rc=$?
[ "$rc" -eq 0 ] || { cat "$tmp/d.txt"; fail "(d) exit status $rc, want 0"; }
grep -q '"cut_by_deadline": 0' "$tmp/d/results.json" || fail "(d) cut_by_deadline not 0"
# OUT holds three files (a device tool brings back only a few), the logs packed
[ "$(cd "$tmp/d" && ls -A | tr '\n' ' ')" = "gpu.log logs.tar.xz results.json " ] || fail "(d) OUT holds: $(ls -A "$tmp/d")"
# (the listing goes to a file: under pipefail, grep -q leaving early can
# kill tar with SIGPIPE and fail the check at random)
tar -tJf "$tmp/d/logs.tar.xz" >"$tmp/d.list" || fail "(d) logs.tar.xz does not list"
grep -q 'plugins.txt$' "$tmp/d.list" || fail "(d) logs.tar.xz lacks plugins.txt"
echo "deadline.sh: ok"
