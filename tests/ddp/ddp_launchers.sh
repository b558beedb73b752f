#!/usr/bin/env bash
# tests/ddp/ddp_launchers.sh — ranks from each launcher's variables in a real
# 2-process MPI world: mpirun starts the processes, and a wrapper turns its
# OMPI_COMM_WORLD_* variables into Slurm's (what srun sets: SLURM_PROCID,
# SLURM_NTASKS, SLURM_LOCALID) or torchrun's (RANK, WORLD_SIZE, LOCAL_RANK)
# and removes the OpenMPI ones, so ddp must take its ranks from those. Each
# rank must log that source, train, and pass the collfix fixture's checks
# of every collective. (Slurm itself is not available here; this covers
# kiln's side of `srun --mpi=pmix`: reading the variables and agreeing
# with MPI's world.)
#   ddp_launchers.sh KILN MPIEXEC TRAIN_FIXTURES DDP_FIXTURES
set -u
kiln=$1 mpiexec=$2 train=$3 ddp=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "${BASH_SOURCE[0]}")/../support/toy_run.sh"
toy_run "$tmp/run.cfg" 4 2 'strategy = "ddp";' "callbacks = ( { name = \"collfix\"; path = \"$tmp/coll\"; } );"
cat > "$tmp/as" <<'SH'
#!/usr/bin/env bash
# as slurm|torchrun KILN ARGS...: re-export OpenMPI's rank variables under another launcher's names
r=$OMPI_COMM_WORLD_RANK n=$OMPI_COMM_WORLD_SIZE l=$OMPI_COMM_WORLD_LOCAL_RANK
unset OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK
case $1 in
  slurm) export SLURM_PROCID=$r SLURM_NTASKS=$n SLURM_LOCALID=$l ;;
  torchrun) export RANK=$r WORLD_SIZE=$n LOCAL_RANK=$l MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 ;;
esac
shift
exec "$@"
SH
chmod +x "$tmp/as"
for launcher in slurm torchrun; do
  case $launcher in
    slurm) want="from Slurm (SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID)" ;;
    torchrun) want="from torchrun-style (RANK/WORLD_SIZE/LOCAL_RANK)" ;;
  esac
  rm -f "$tmp"/coll.*
  "$mpiexec" -n 2 "$tmp/as" "$launcher" "$kiln" fit "$tmp/run.cfg" >"$tmp/$launcher.log" 2>&1 ||
    { cat "$tmp/$launcher.log"; echo "FAIL: $launcher: the job failed"; exit 1; }
  for r in 0 1; do
    grep -q "ddp: rank $r of 2 (local rank $r) $want" "$tmp/$launcher.log" ||
      { cat "$tmp/$launcher.log"; echo "FAIL: $launcher: rank $r did not log '$want'"; exit 1; }
    grep -qx "ok $r 2" "$tmp/coll.$r" || { echo "FAIL: $launcher: collectives on rank $r: $(cat "$tmp/coll.$r" 2>&1)"; exit 1; }
  done
  echo "$launcher variables: both ranks took them, trained, collectives ok"
done
