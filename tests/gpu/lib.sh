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

# gpu_budget WANT MIN: prints the seconds a step may take: WANT, or less
# when the deadline, less the reserve, comes sooner; fails (printing
# nothing) when that is under MIN, the least the step can do anything in.
gpu_budget() {
  local want=$1 min=${KILN_GPU_TEST_MIN:-$2} left
  left=$(($(gpu_left) - ${KILN_GPU_RESERVE:-15}))
  [ "$left" -lt "$want" ] && want=$left
  [ "$want" -ge "$min" ] || return 1
  echo "$want"
}

# gpu_skip_why: the JSON field a skipped step records
gpu_skip_why() { echo "\"why\": \"the deadline: $(gpu_left) s left\""; }

# The steps of tests/gpu/run.sh, in the order they run: the kernels first,
# then the transformer's checks and figures (what the GPU run is for), then
# Fashion-MNIST in every precision, the sanitizers (slow) and the MLP
# benchmark, so that a run cut short by its deadline has done the most
# telling checks.
GPU_STEPS="kernels gpt gpt2 fashion sanitizers bench"

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
