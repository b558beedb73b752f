#!/usr/bin/env bash
# tests/slurm/slurm_ddp.sh — the ddp strategy under a real one-node Slurm:
# munged, slurmctld and slurmd started here with a generated slurm.conf for
# this host (its name and core count) and a private state directory under
# the build folder, stopped again on every exit path (trap), nothing left
# running. Checked: (a) `srun -n 2 --mpi=pmix kiln fit` trains the same
# 2-rank job as `mpirun -n 2` (tests/ddp/test_ddp_fit.c's ddp64 run) to the
# same weights on both ranks, bit for bit, with one run directory; (b)
# `srun -n 2 --mpi=none` stops with ddp's one line naming `srun --mpi=pmix`,
# a non-zero status and none of Open MPI's abort text, and `srun -n 1
# --mpi=none` trains (a world of one needs no PMIx); (c) `mpirun -n 2`
# inside an allocation (salloc), whose ranks inherit SLURM_* next to
# mpirun's own variables, is not refused and trains to the same weights;
# (d) examples/slurm/kiln-ddp.sbatch, the script docs/distributed.md shows
# verbatim (checked here too), submitted with sbatch --wait: same weights.
# Exit 77 (skipped, with the reason) without Slurm and munge (Debian:
# slurm-wlm, munge; `.ci/setup.sh test` installs them), without root (slurmd
# launches tasks as root) or without the Fashion-MNIST package.
#   slurm_ddp.sh KILN MPIEXEC DDP_FIXTURES STATE_PARENT SOURCE_DIR
set -u
kiln=$1 mpiexec=$2 ddpfix=$3 state_parent=$4 src=$5
data=/usr/share/datasets/fashion-mnist
skip() { echo "skipped: $*"; exit 77; }
for t in munged mungekey slurmctld slurmd srun sbatch salloc sinfo squeue scancel; do
  command -v "$t" >/dev/null || skip "$t not found: install Debian's slurm-wlm and munge (.ci/setup.sh test does)"
done
[ "$(id -u)" = 0 ] || skip "slurmd has to run as root to start tasks; this runs as $(id -un)"
[ -d "$data" ] || skip "no $data (Debian: dataset-fashion-mnist)"
command -v python3 >/dev/null || skip "python3 not found (picks free ports)"

mkdir -p "$state_parent"
st=$(mktemp -d "$state_parent/slurm-test.XXXXXX")
chmod 711 "$st" # munged wants its socket's directory searchable by all
# a Unix socket path has at most 107 bytes: a deep build folder gets a short one in /tmp
sockdir=$st
[ ${#st} -gt 80 ] && { sockdir=$(mktemp -d /tmp/kiln-munge.XXXXXX); chmod 711 "$sockdir"; }
pids=() # the daemons started here, killed by their ids on the way out
fg_pid= # the command running now (see bg)
export SLURM_CONF=$st/slurm.conf

# Our processes by their ids: the daemons (pids), the command running now,
# and whatever still names this test's private directory on its command
# line or holds a file in it (a job step's slurmstepd, srun, kiln).
ours() {
  local p
  for p in $(ls /proc | grep -E '^[0-9]+$'); do
    [ "$p" = $$ ] && continue
    if { tr '\0' ' ' < "/proc/$p/cmdline"; } 2>/dev/null | grep -qF "$st/" ||
       ls -l "/proc/$p/fd" 2>/dev/null | grep -qF "$st/"; then
      echo "$p"
    fi
  done
}
cleanup() {
  local rc=$? p
  trap - EXIT INT TERM
  # jobs first, while the controller lives, so slurmd ends their steps;
  # bounded: a client waits long for a controller that is gone
  if [ ${#pids[@]} -ge 2 ] && kill -0 "${pids[1]}" 2>/dev/null; then
    timeout 10 scancel --quiet --full --user=root 2>/dev/null
    for _ in $(seq 1 25); do [ -z "$(timeout 3 squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
  fi
  [ -n "$fg_pid" ] && kill -TERM "$fg_pid" 2>/dev/null
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for _ in $(seq 1 25); do
    local alive=0
    for p in "${pids[@]}" $fg_pid; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.2
  done
  for p in "${pids[@]}" $fg_pid $(ours); do
    kill -KILL "$p" 2>/dev/null && echo "cleanup: killed $p ($( { tr '\0' ' ' < "/proc/$p/cmdline"; } 2>/dev/null | cut -c1-60))"
  done
  if [ $rc = 0 ] || [ $rc = 77 ]; then rm -rf "$st"; else echo "state and logs kept in $st"; fi
  [ "$sockdir" != "$st" ] && rm -rf "$sockdir"
  exit $rc
}
trap cleanup EXIT
trap 'echo "stopped by a signal"; exit 130' INT TERM
fail() { echo "FAIL: $*"; exit 1; }
# Runs a command in the background and waits for it: bash runs a trap only
# between commands, and a wait is interrupted by the signal, so a TERM (the
# timeout in CMakeLists.txt) reaches cleanup at once, not after the job.
bg() {
  "$@" &
  fg_pid=$!
  wait "$fg_pid"
  local rc=$?
  fg_pid=
  return $rc
}

# ------------------------------------------------------------------ daemons
mungekey --create --keyfile="$st/munge.key" >/dev/null 2>&1 ||
  { dd if=/dev/urandom of="$st/munge.key" bs=1024 count=1 2>/dev/null; }
chmod 600 "$st/munge.key"
munged --foreground --force --key-file="$st/munge.key" --socket="$sockdir/munge.sock" \
  --pid-file="$st/munged.pid" --log-file="$st/munged.log" --seed-file="$st/munged.seed" >"$st/munged.out" 2>&1 &
pids+=($!)
for _ in $(seq 1 50); do [ -S "$sockdir/munge.sock" ] && break; sleep 0.1; done
[ -S "$sockdir/munge.sock" ] || { cat "$st/munged.out"; fail "munged did not create its socket"; }

host=$(hostname -s)
read -r p1 p2 < <(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1", 0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
mkdir -p "$st/spool" "$st/state"
cat > "$SLURM_CONF" <<CONF
# one node, this host, generated by tests/slurm/slurm_ddp.sh
ClusterName=kilntest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$p1
SlurmdPort=$p2
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sockdir/munge.sock
StateSaveLocation=$st/state
SlurmdSpoolDir=$st/spool
SlurmctldPidFile=$st/slurmctld.pid
SlurmdPidFile=$st/slurmd.pid
SlurmctldLogFile=$st/slurmctld.log
SlurmdLogFile=$st/slurmd.log
# no cgroups in a container: plain process tracking, no task binding
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=kiln Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
slurmctld -D -i -f "$SLURM_CONF" >"$st/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" -N "$host" >"$st/slurmd.out" 2>&1 &
pids+=($!)
state=
for _ in $(seq 1 150); do
  state=$(sinfo -h -o %t 2>/dev/null)
  [ "$state" = idle ] && break
  sleep 0.2
done
[ "$state" = idle ] || { tail -20 "$st"/slurmctld.out "$st"/slurmd.out; fail "the node is '$state' after 30 s, expected idle"; }
srun --mpi=list 2>&1 | grep -qw pmix || { srun --mpi=list; fail "this Slurm has no pmix MPI plugin (srun --mpi=list)"; }
echo "one-node Slurm up: node $host, $(nproc) CPUs, ports $p1/$p2, state in $st"

# ------------------------------------------------------------------ jobs
# the job of tests/ddp/test_ddp_fit.c's 2-rank run: mlp [784, 64, 10], SGD,
# 2 ranks x 64, 5 batches, each rank's final weights dumped by ddpdump
cfg() { # NAME: writes $st/NAME/run.cfg
  mkdir -p "$st/$1"
  cat > "$st/$1/run.cfg" <<CFG
plugins = { dirs = ["$ddpfix"]; };
trainer = { max_epochs = 1; seed = 42; default_root_dir = "$st/$1/runs"; limit_val_batches = 0;
  num_sanity_val_steps = 0; threads = 1; log_every_n_steps = 1; limit_train_batches = 5; };
accelerator = "cpu"; precision = "32-true"; strategy = "ddp";
data = { name = "idx"; dir = "$data"; batch_size = 64; };
module = { name = "mlp"; layers = [784, 64, 10]; activation = "relu"; };
optimizer = { name = "sgd"; lr = 0.1; momentum = 0.0; };
callbacks = ( { name = "ddpdump"; path = "$st/$1/w"; }, { name = "csv_logger"; } );
CFG
}
same_weights() { # NAME: both ranks' weights equal the mpirun run's, bit for bit; one run directory
  local r
  for r in 0 1; do
    [ -s "$st/$1/w.$r" ] || fail "$1: rank $r wrote no weights"
    cmp -s "$st/mpirun/w.$r" "$st/$1/w.$r" || fail "$1: rank $r's weights differ from mpirun -n 2's"
  done
  local dirs
  dirs=$(ls "$st/$1/runs")
  [ "$dirs" = version_0 ] || fail "$1: expected one run directory version_0, found: $(echo $dirs)"
}
ompi_abort='An error occurred in MPI_Init|direct launched|OPAL ERROR|MPI_ERRORS_ARE_FATAL|PMI support'

cfg mpirun
bg timeout 120 "$mpiexec" -n 2 "$kiln" fit "$st/mpirun/run.cfg" >"$st/mpirun/log" 2>&1 ||
  { cat "$st/mpirun/log"; fail "mpirun -n 2 (the reference) failed"; }

# (a) srun with PMIx
cfg srun
bg timeout 120 srun -n 2 --mpi=pmix "$kiln" fit "$st/srun/run.cfg" >"$st/srun/log" 2>&1 ||
  { cat "$st/srun/log"; fail "srun -n 2 --mpi=pmix failed"; }
for r in 0 1; do
  grep -q "ddp: rank $r of 2 (local rank $r) from Slurm (SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID)" "$st/srun/log" ||
    { cat "$st/srun/log"; fail "srun: rank $r did not take its rank from Slurm's variables"; }
done
same_weights srun
echo "(a) srun -n 2 --mpi=pmix: ranks from Slurm, weights = mpirun -n 2's bit for bit, one run directory"

# (b) srun without PMIx: ddp's line, not Open MPI's abort
cfg none
bg timeout 60 srun -n 2 --mpi=none "$kiln" fit "$st/none/run.cfg" >"$st/none/log" 2>&1 && fail "srun --mpi=none: exited 0"
grep -q "Slurm started this process as task [01] of 2 (SLURM_PROCID/SLURM_NTASKS) but no PMIx server is reachable.*srun --mpi=pmix.*mpirun" "$st/none/log" ||
  { cat "$st/none/log"; fail "srun --mpi=none: no line naming srun --mpi=pmix"; }
grep -Eq "$ompi_abort" "$st/none/log" && { cat "$st/none/log"; fail "srun --mpi=none: Open MPI's abort text"; }
echo "(b) srun -n 2 --mpi=none: $(grep -o 'ddp: Slurm started this process as task 0[^`]*`srun --mpi=pmix`' "$st/none/log" | head -1)..."
cfg one
sed -i 's/batch_size = 64/batch_size = 128/' "$st/one/run.cfg"
bg timeout 120 srun -n 1 --mpi=none "$kiln" fit "$st/one/run.cfg" >"$st/one/log" 2>&1 ||
  { cat "$st/one/log"; fail "srun -n 1 --mpi=none: a world of one did not run"; }
grep -q "ddp: rank 0 of 1 (local rank 0) from Slurm" "$st/one/log" || { cat "$st/one/log"; fail "srun -n 1: no rank line"; }
echo "(b) srun -n 1 --mpi=none: trains (one rank needs no PMIx)"

# (c) mpirun inside an allocation: SLURM_* inherited, not refused
cfg salloc
bg timeout 120 salloc -n 2 "$mpiexec" -n 2 "$kiln" fit "$st/salloc/run.cfg" >"$st/salloc/log" 2>&1 ||
  { cat "$st/salloc/log"; fail "salloc -n 2 mpirun -n 2 failed"; }
grep -Eq "$ompi_abort|PMIx server is reachable" "$st/salloc/log" && { cat "$st/salloc/log"; fail "salloc + mpirun: refused or aborted"; }
same_weights salloc
echo "(c) salloc -n 2 mpirun -n 2: weights = mpirun -n 2's"

# (d) the documented batch script, as the documentation shows it
script=$src/examples/slurm/kiln-ddp.sbatch
python3 - "$src/docs/distributed.md" "$script" <<'PY' || fail "docs/distributed.md does not show examples/slurm/kiln-ddp.sbatch verbatim"
import sys
doc, script = open(sys.argv[1]).read(), open(sys.argv[2]).read()
sys.exit(0 if "```bash\n" + script + "```\n" in doc else 1)
PY
cfg sbatch
# kiln on PATH as an installation has it; the job inherits sbatch's environment
bg env PATH="$(dirname "$kiln"):$PATH" timeout 150 sbatch --wait --quiet --chdir="$st/sbatch" "$script" "$st/sbatch/run.cfg" ||
  { cat "$st"/sbatch/kiln-ddp-*.out 2>/dev/null; fail "sbatch --wait kiln-ddp.sbatch failed"; }
out=$(ls "$st"/sbatch/kiln-ddp-*.out 2>/dev/null | head -1)
[ -n "$out" ] || fail "sbatch: no kiln-ddp-<jobid>.out in the submit directory"
grep -q "ddp: rank 1 of 2 (local rank 1) from Slurm" "$out" || { cat "$out"; fail "sbatch: rank 1 did not run under srun"; }
same_weights sbatch
echo "(d) sbatch --wait examples/slurm/kiln-ddp.sbatch (shown verbatim in docs/distributed.md): weights = mpirun -n 2's"
echo "all Slurm checks passed"
