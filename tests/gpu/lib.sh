# tests/gpu/lib.sh — sourced by tests/gpu/run.sh, tests/gpu/gpt_checks.sh
# and bench/gpu/gpt2.sh: the GPU run's time budget and the choice of its
# steps. A device lent for a few minutes kills a command at its limit, and a
# killed script reports nothing; so every step asks gpu_budget how long it
# may take, and a step that no longer fits is recorded as skipped, with the
# time that was left, while the report is still written before the limit.
#
# KILN_GPU_DEADLINE  the epoch second by which the whole run must have
#                    ended (exported, so nested scripts see the same one);
#                    0 or unset: no deadline
# KILN_GPU_RESERVE   seconds kept back for the report (default 15)
# KILN_GPU_TEST_NOW  test hook: the epoch second to use instead of date's
# KILN_GPU_TEST_MIN  test hook: every step's least time, in place of its own

gpu_now() { if [ -n "${KILN_GPU_TEST_NOW:-}" ]; then echo "$KILN_GPU_TEST_NOW"; else date +%s; fi; }

# seconds left before the deadline (a large number without one)
gpu_left() {
  if [ "${KILN_GPU_DEADLINE:-0}" -gt 0 ]; then echo $((KILN_GPU_DEADLINE - $(gpu_now))); else echo 1000000; fi
}

# gpu_budget WANT MIN [HOLD]: prints the seconds a step may take: WANT, or
# less when the deadline, less the reserve and HOLD (seconds kept for what
# comes after it in the same step), comes sooner; HOLD gives way to MIN,
# the least the step can do anything in; fails (printing nothing) when
# even MIN is not left before the deadline, less the reserve.
gpu_budget() {
  local want=$1 min=${KILN_GPU_TEST_MIN:-$2} left
  left=$(($(gpu_left) - ${KILN_GPU_RESERVE:-15}))
  [ $((left - ${3:-0})) -lt "$want" ] && want=$((left - ${3:-0}))
  [ "$want" -lt "$min" ] && want=$min
  [ "$want" -le "$left" ] || return 1
  echo "$want"
}

# gpu_timed_out STATUS: timeout's status for a command it stopped (124, or
# 137 when the command outlived the grace period and was killed)
gpu_timed_out() { [ "$1" -eq 124 ] || [ "$1" -eq 137 ]; }

# gpu_cut_why LIMIT WANT: the JSON field of a run that its time limit
# ended where the deadline had cut that limit (LIMIT s) below its own (WANT
# s): a skip for the deadline, not a failure
gpu_cut_why() { echo "\"why\": \"the deadline: cut at $1 s (its own limit: $2 s)\""; }

# gpu_skip_why: the JSON field a skipped step records
gpu_skip_why() { echo "\"why\": \"the deadline: $(gpu_left) s left\""; }

# The steps of tests/gpu/run.sh, in the order they run: the kernels first,
# then the transformer's checks (what the GPU run is for), Fashion-MNIST in
# every precision (nf4 and the only torchrun/NCCL run of the MLP among
# them), the GPT-2 124M figures, the sanitizers (slow) and the MLP
# benchmark.
GPU_STEPS="kernels gpt fashion gpt2 sanitizers bench"

# Under a deadline each step gets a share of the time, so that one call of
# `--deadline 570` (a device tool's 10-minute limit, less a margin) runs
# every step at least minimally instead of the first three soaking it up
# (torch.compile alone would take all the GPT-2 step is given). A step's
# WEIGHT is its share in seconds of such a run (570 s less the 15 s
# reserve: the weights add up to 555); its MIN the least it can do anything
# in (its first check's own least time). Before a step starts, gpu_window
# gives it   (the time left) * its weight / (its and the later steps'
# weights),   at least its MIN, and never so much that a later step in the
# plan loses its MIN (later steps first come first), so a step that
# finishes early passes its spare time on to all the steps after it; the
# last step of a plan gets all that is left, and a step run alone (rerun
# by name) all the deadline gives. Without a deadline there are no shares.
# The weights are estimates made before any GPU run (the kernels: three
# ctest runs of test_cuda_kernels, a few seconds each; gpt: 5 small runs,
# 3 x 200 fortunes steps, GPT-2 124M under ddp; fashion: 9 fits of 2
# epochs; gpt2: 4 kiln runs and the PyTorch peer, eager only in 120 s
# (torch.compile needs 180: rerun `gpt2` by name); sanitizers: memcheck of
# every kernel, then the flash attention under racecheck and memcheck,
# 20 s each at least; bench: 3 kiln fits, the GEMM bound and the step
# replay); gpu.log says what each step took: set them from it.
#   step        weight  min
GPU_STEP_SHARES="kernels:60:30 gpt:140:60 fashion:90:20 gpt2:120:60 sanitizers:95:45 bench:50:40"

# gpu_step_share STEP: "WEIGHT MIN" of STEP (its MIN is KILN_GPU_TEST_MIN
# where that is set)
gpu_step_share() {
  local e
  for e in $GPU_STEP_SHARES; do
    case "$e" in "$1":*) e=${e#*:}; echo "${e%%:*} ${KILN_GPU_TEST_MIN:-${e#*:}}"; return 0 ;; esac
  done
  return 1
}

# gpu_window STEP [LATER...]: the deadline (an epoch second, for
# KILN_GPU_DEADLINE while STEP runs) of STEP's share of the time left, the
# steps LATER still to run after it (see GPU_STEP_SHARES); 0 without a
# deadline. A step's own budgets (gpu_budget) then keep the reserve back
# from its share's end, as they do from the run's.
gpu_window() {
  local w min sum left share hold=0 s sw smin
  [ "${KILN_GPU_DEADLINE:-0}" -gt 0 ] || { echo 0; return 0; }
  read -r w min <<<"$(gpu_step_share "$1")"
  shift
  sum=$w
  left=$(($(gpu_left) - ${KILN_GPU_RESERVE:-15}))
  for s in "$@"; do
    read -r sw smin <<<"$(gpu_step_share "$s")"
    sum=$((sum + sw))
    # a later step keeps its least time where this step's own fits beside it
    [ $((min + hold + smin)) -le "$left" ] && hold=$((hold + smin))
  done
  share=$((left * w / sum))
  [ "$share" -lt "$min" ] && share=$min
  [ "$share" -gt $((left - hold)) ] && share=$((left - hold))
  echo $(($(gpu_now) + share + ${KILN_GPU_RESERVE:-15}))
}

# gpu_plan SPEC: the steps SPEC names, in GPU_STEPS' order, space-separated.
# SPEC is a comma-separated list of steps and of the parts all (every
# step), core (kernels, sanitizers, fashion, bench) and transformer (gpt,
# gpt2). Fails with one line on stderr naming an unknown word.
gpu_plan() {
  local want=" " w s plan=""
  local IFS=,
  for w in $1; do
    case "$w" in
      all) want="$want$GPU_STEPS " ;;
      core) want="$want kernels sanitizers fashion bench " ;;
      transformer) want="$want gpt gpt2 " ;;
      *)
        case " $GPU_STEPS " in
          *" $w "*) want="$want$w " ;;
          *) echo "run.sh: unknown step '$w': expected all, core, transformer or one of: $GPU_STEPS" >&2; return 1 ;;
        esac
        ;;
    esac
  done
  IFS=' '
  for s in $GPU_STEPS; do
    case "$want" in *" $s "*) plan="$plan${plan:+ }$s" ;; esac
  done
  [ -n "$plan" ] || { echo "run.sh: no step chosen" >&2; return 1; }
  echo "$plan"
}

# gpu_isnum WORD: true when WORD is a finite decimal number (a figure a
# check may compare and write into JSON as it is); "", "nan", "inf" and
# anything else are not, so an empty or missing figure never passes a
# comparison by accident (awk compares "" <= "1e-4" as strings: true)
gpu_isnum() { [[ $1 =~ ^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$ ]]; }
