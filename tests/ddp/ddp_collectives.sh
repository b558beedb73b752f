#!/usr/bin/env bash
# tests/ddp/ddp_collectives.sh — the host's collective services (barrier,
# reduce SUM/MEAN, broadcast, all_gather) as a plugin sees them: the collfix
# fixture checks every result itself, on 1 process (strategy single) and on
# 2 ranks (ddp under mpirun, with a deadline and with timeout_s = 0, which
# takes MPI's blocking collectives); each rank must leave "ok <rank> <world>".
#   ddp_collectives.sh KILN MPIEXEC TRAIN_FIXTURES DDP_FIXTURES
set -u
kiln=$1 mpiexec=$2 train=$3 ddp=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "${BASH_SOURCE[0]}")/../support/toy_run.sh"
toy_run "$tmp/run.cfg" 2 1 "callbacks = ( { name = \"collfix\"; path = \"$tmp/coll\"; } );"
"$kiln" -q fit "$tmp/run.cfg" || exit 1
grep -qx "ok 0 1" "$tmp/coll.0" || { echo "1 process: $(cat "$tmp/coll.0" 2>&1)"; exit 1; }
rm -f "$tmp"/coll.*
"$mpiexec" -n 2 "$kiln" -q fit "$tmp/run.cfg" --set strategy=ddp || exit 1
grep -qx "ok 0 2" "$tmp/coll.0" && grep -qx "ok 1 2" "$tmp/coll.1" || { echo "2 ranks: $(cat "$tmp"/coll.* 2>&1)"; exit 1; }
# timeout_s = 0: the blocking MPI collectives
rm -f "$tmp"/coll.*
"$mpiexec" -n 2 "$kiln" -q fit "$tmp/run.cfg" --set strategy=ddp --set strategy.timeout_s=0.0 || exit 1
grep -qx "ok 0 2" "$tmp/coll.0" && grep -qx "ok 1 2" "$tmp/coll.1" || { echo "2 ranks, blocking: $(cat "$tmp"/coll.* 2>&1)"; exit 1; }
echo "collectives: ok on 1 process and on 2 ranks (non-blocking and blocking)"
