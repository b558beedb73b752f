#!/usr/bin/env bash
# tests/slurm/slurm_hint.sh — ddp's word before MPI_Init when Slurm started
# the process without PMIx, on any machine (no Slurm needed: srun's task
# variables are set by hand, as `srun --mpi=none` sets them; the real srun
# runs in slurm_ddp.sh). (a) 2 tasks without PMIx: one line naming
# `srun --mpi=pmix` and `mpirun`, a non-zero status, none of Open MPI's
# abort text; (b) 1 task without PMIx, SLURM_STEP_ID set: trains (Open MPI
# would abort on that variable alone); (c) mpirun's ranks that also carry
# SLURM_* (mpirun inside an allocation) are not refused.
#   slurm_hint.sh KILN MPIEXEC TRAIN_FIXTURES DDP_FIXTURES
set -u
kiln=$1 mpiexec=$2 train=$3 ddp=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
. "$(dirname "${BASH_SOURCE[0]}")/../support/toy_run.sh"
toy_run "$tmp/run.cfg" 4 2 'strategy = "ddp";'
# what srun --mpi=none gives a task (and nothing of PMIx or mpirun)
srun_env=(env -u PMIX_RANK -u PMIX_SERVER_URI -u PMIX_SERVER_URI2 -u PMIX_SERVER_URI21 -u PMIX_SERVER_URI3
          -u PMIX_SERVER_URI4 -u PMIX_SERVER_URI41 -u OMPI_COMM_WORLD_SIZE -u OMPI_COMM_WORLD_RANK -u PMI_RANK -u PMI_FD
          SLURM_JOB_ID=4242 SLURM_JOBID=4242 SLURM_STEP_ID=0 SLURM_STEPID=0 SLURM_NODELIST=localhost
          SLURM_JOB_NODELIST=localhost SLURM_LOCALID=0)
ompi_abort='An error occurred in MPI_Init|direct launched|OPAL ERROR|MPI_ERRORS_ARE_FATAL|PMI support'

# (a)
"${srun_env[@]}" SLURM_PROCID=1 SLURM_NTASKS=2 timeout 60 "$kiln" fit "$tmp/run.cfg" >"$tmp/a.log" 2>&1
rc=$?
[ $rc != 0 ] || { cat "$tmp/a.log"; fail "(a) 2 Slurm tasks without PMIx: exit 0"; }
[ $rc != 124 ] || { cat "$tmp/a.log"; fail "(a) 2 Slurm tasks without PMIx: still running after 60 s"; }
line="ddp: Slurm started this process as task 1 of 2 (SLURM_PROCID/SLURM_NTASKS) but no PMIx server is reachable (PMIX_RANK and PMIX_SERVER_URI\* are unset), so MPI cannot form the world: launch with \`srun --mpi=pmix\`, or run \`mpirun\` inside the allocation"
grep -q "$line" "$tmp/a.log" || { cat "$tmp/a.log"; fail "(a) no line naming srun --mpi=pmix"; }
grep -Eq "$ompi_abort" "$tmp/a.log" && { cat "$tmp/a.log"; fail "(a) Open MPI's abort text"; }
[ "$(grep -c 'srun --mpi=pmix' "$tmp/a.log")" = 1 ] || { cat "$tmp/a.log"; fail "(a) the hint is not one line"; }
echo "(a) exit $rc: $(grep -o 'ddp: Slurm started.*' "$tmp/a.log")"

# (b)
"${srun_env[@]}" SLURM_PROCID=0 SLURM_NTASKS=1 timeout 60 "$kiln" fit "$tmp/run.cfg" >"$tmp/b.log" 2>&1 ||
  { cat "$tmp/b.log"; fail "(b) one Slurm task without PMIx did not train"; }
grep -q "ddp: rank 0 of 1 (local rank 0) from Slurm" "$tmp/b.log" || { cat "$tmp/b.log"; fail "(b) no rank line"; }
echo "(b) one task without PMIx: trained as a singleton"

# (c)
cat > "$tmp/in_alloc" <<'SH'
#!/usr/bin/env bash
# what mpirun's ranks see inside an allocation: the batch step's SLURM_*
export SLURM_JOB_ID=4242 SLURM_JOBID=4242 SLURM_PROCID=0 SLURM_NTASKS=1 SLURM_LOCALID=0 SLURM_NODELIST=localhost
exec "$@"
SH
chmod +x "$tmp/in_alloc"
timeout 120 "$mpiexec" -n 2 "$tmp/in_alloc" "$kiln" fit "$tmp/run.cfg" >"$tmp/c.log" 2>&1 ||
  { cat "$tmp/c.log"; fail "(c) mpirun with SLURM_* in its ranks' environment failed"; }
for r in 0 1; do
  grep -q "ddp: rank $r of 2 (local rank $r) from OpenMPI" "$tmp/c.log" || { cat "$tmp/c.log"; fail "(c) rank $r"; }
done
echo "(c) mpirun -n 2 with SLURM_* inherited: not refused, ranks from OpenMPI"
