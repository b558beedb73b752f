#!/usr/bin/env bash
# tests/ddp_nccl_fake/ddp_nccl_fake.sh — ddp's NCCL path end to end on a
# machine without a GPU: `kiln fit` with the fake cuda accelerator
# ("cudafake:cuda", device memory = host memory) and the ddp build linked to
# the fake NCCL over MPI ("ddpfake:ddp"), on Fashion-MNIST (idx shards like
# DistributedSampler, so 2 ranks x 64 = 1 process x 128), mlp [784, 64, 10],
# SGD. Asserts: (a) the 2-rank run succeeds; (b) each rank logs that ddp uses
# NCCL; (c) fake NCCL counted one broadcast per bucket at setup and one
# all-reduce (ncclAvg) per bucket per optimizer step, also with 2 buckets
# and accumulate_grad_batches=2 (no all-reduce on accumulating batches);
# (d) both ranks end byte-identical and equal, within 1e-5 relative, the
# 1-process cpu run at batch 128 and the 2-rank run of the real ddp over MPI
# on the cpu accelerator; (e) one process (no mpirun) takes the NCCL path
# too and matches the 1-process run at batch 64; (f) a stopped rank 1 makes
# rank 0 fail after timeout_s with "did not complete within timeout_s"
# (the fake's collectives are enqueued, so ddp's watchdog sees them pending);
# (g) the launch without MPI, with a large plugin broadcast that grows the
# staging buffer on rank 1 (bcastfix: the accelerator's zero fill must not
# land on the received bytes); (h) 16-mixed with overflowing steps skipped
# alike on both ranks; (i) NCCL's asynchronous errors (a peer lost:
# ncclRemoteError, ncclSystemError; a failed kernel) abort the communicator
# at once, with one line, and never reach ncclCommDestroy; (j) a rank lost
# between the id exchange and NCCL's init: the others' init ends after
# timeout_s with a line naming rank, world size and seconds; (k) rank 0's
# ncclGetUniqueId fails: every rank stops at once, over MPI and over TCP;
# (l) buckets in one piece in memory run in place (no packing), and a
# layout with a gap mixes an in-place and a staged bucket correctly.
# (g) also covers the rendezvous authenticated with KILN_RDZV_SECRET, rank
# 0's warning when it is unset, and a Slurm launch without MPI (rendezvous
# host and port from the job). The failures are injected into the fake NCCL (KILN_FAKE_NCCL_FAIL), and no
# run may print one of its "contract violation" lines. The fake accelerator's
# device memory is sealed from host code (tests/cuda_fake/fake_cuda.h; the
# fake NCCL holds a collective's buffers open while it runs), so ddp reading
# or writing a gradient on the host instead of through the accelerator faults.
# Exit 77 (skipped) without the dataset.
#   ddp_nccl_fake.sh KILN MPIEXEC TRAIN_FIXTURES DDP_FIXTURES FAKE_PLUGIN_DIR
set -u
kiln=$1 mpiexec=$2 train=$3 ddpfix=$4 fake=$5
data=/usr/share/datasets/fashion-mnist
[ -d "$data" ] || { echo "no $data: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export KILN_FAKE_NCCL_ALL_DEVICE=1 # the fake cudart calls every pointer device memory
export KILN_FAKE_CUDA_DEVICES=2    # one fake GPU per local rank (cuda refuses to share one)
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# run TAG NP ACCEL STRATEGY BATCH TRAINER_EXTRA [callbacks extra]; NP 0: no mpirun
run() {
  local tag=$1 np=$2 accel=$3 strat=$4 batch=$5 extra=$6 cb=${7:-}
  local prec=${PREC:-'"32-true"'}
  mkdir -p "$tmp/$tag"
  cat > "$tmp/$tag/run.cfg" <<CFG
plugins = { dirs = ["$train", "$ddpfix", "$fake"]; };
trainer = { max_epochs = 1; seed = 42; default_root_dir = "$tmp/$tag/runs"; limit_val_batches = 0;
  num_sanity_val_steps = 0; threads = 1; log_every_n_steps = ${LOGN:-1}; $extra };
accelerator = "$accel"; precision = $prec; strategy = $strat;
data = { name = "idx"; dir = "$data"; batch_size = $batch; };
module = { name = "mlp"; layers = ${LAYERS:-[784, 64, 10]}; activation = "relu"; };
optimizer = { name = "sgd"; lr = 0.1; momentum = 0.0; };
callbacks = ( { name = "ddpdump"; path = "$tmp/$tag/w"; } $cb );
CFG
  local tmo=${TMO:-120}
  if [ "$np" = 0 ]; then timeout -s KILL "$tmo" "$kiln" fit "$tmp/$tag/run.cfg" > "$tmp/$tag/log" 2>&1
  else timeout -s KILL "$tmo" "$mpiexec" -n "$np" ${WRAP:-} "$kiln" fit "$tmp/$tag/run.cfg" > "$tmp/$tag/log" 2>&1; fi
}
# relative L2 difference of two float32 dumps, printed; status 0 when <= tol
close() { # A B TOL LABEL
  local d
  d=$(paste <(od -An -v -f -w4 "$1") <(od -An -v -f -w4 "$2") |
      awk '{ d = $1 - $2; n += d * d; s += $1 * $1; c++ } END { if (c == 0 || s == 0) print "inf"; else printf "%.3g\n", sqrt(n / s) }')
  echo "  $4: relative difference $d"
  awk -v d="$d" -v t="$3" 'BEGIN { exit !(d != "inf" && d + 0 <= t + 0) }'
}
# "fake-nccl: rank R of W: allreduce N (B bytes, A avg), broadcast M (C bytes), destroyed"
counts() { # LOG RANK -> "N A M"
  sed -n "s/^fake-nccl: rank $2 of [0-9]*: allreduce \([0-9]*\) ([0-9]* bytes, \([0-9]*\) avg), broadcast \([0-9]*\) .*/\1 \2 \3/p" "$1" | head -1
}
expect_counts() { # TAG NRANKS ALLREDUCES BROADCASTS
  for ((r = 0; r < $2; r++)); do
    local c; c=$(counts "$tmp/$1/log" $r)
    [ "$c" = "$3 $3 $4" ] || fail "$1 rank $r: fake NCCL counted '$c' (all-reduces, of them avg, broadcasts), expected '$3 $3 $4'"
  done
  echo "  $1: fake NCCL per rank: $3 all-reduces (ncclAvg), $4 broadcasts"
}
# "ddp: rank R: ... barriers; N broadcasts and all-reduces in place"
expect_in_place() { # TAG NRANKS N
  for ((r = 0; r < $2; r++)); do
    local c; c=$(sed -n "s/.*ddp: rank $r: .* barriers; \([0-9]*\) broadcasts and all-reduces in place.*/\1/p" "$tmp/$1/log" | head -1)
    [ "$c" = "$3" ] || fail "$1 rank $r: '$c' collectives in place, expected $3"
  done
  echo "  $1: $3 collectives in place per rank"
}
expect_nccl_line() { # TAG NRANKS
  for ((r = 0; r < $2; r++)); do
    grep -q "ddp: rank $r: NCCL [0-9.]* on device" "$tmp/$1/log" || fail "$1: rank $r did not log ddp's NCCL line"
  done
}

# References: 1 process at 128 and 64 on the cpu; the real ddp over MPI on the cpu.
run ref128 0 cpu '"single"' 128 "limit_train_batches = 5;" || { cat "$tmp/ref128/log"; exit 1; }
run ref64 0 cpu '"single"' 64 "limit_train_batches = 5;" || { cat "$tmp/ref64/log"; exit 1; }
run mpi 2 cpu '"ddp"' 64 "limit_train_batches = 5;" || { cat "$tmp/mpi/log"; exit 1; }
cmp -s "$tmp/mpi/w.0" "$tmp/mpi/w.1" || fail "real ddp over MPI: ranks differ (reference broken)"

# (a)-(d): 2 ranks on NCCL, 5 steps, one bucket (203560 bytes < 25 MiB).
if run nccl 2 cudafake:cuda '"ddpfake:ddp"' 64 "limit_train_batches = 5;"; then
  expect_nccl_line nccl 2
  expect_counts nccl 2 5 1
  # mlp's tensors lie back to back in the host's arenas: the bucket is
  # broadcast and averaged where it is, with no packing copies
  expect_in_place nccl 2 6
  cmp -s "$tmp/nccl/w.0" "$tmp/nccl/w.1" || { fail "nccl: ranks 0 and 1 end with different weights"; close "$tmp/nccl/w.0" "$tmp/nccl/w.1" 0 "nccl rank 0 vs rank 1"; }
  for r in 0 1; do
    close "$tmp/ref128/w.0" "$tmp/nccl/w.$r" 1e-5 "1 process x 128 (cpu) vs NCCL rank $r (2 x 64)" ||
      fail "nccl rank $r differs from the 1-process run at batch 128"
    close "$tmp/mpi/w.$r" "$tmp/nccl/w.$r" 1e-5 "real ddp over MPI rank $r vs NCCL rank $r" ||
      fail "nccl rank $r differs from the real ddp over MPI"
  done
else
  cat "$tmp/nccl/log"; fail "(a) the 2-rank NCCL run failed"
fi

# (c) 2 buckets (bucket_mb 0.1 = 104857 bytes) and accumulate_grad_batches 2
# over 4 batches: 2 broadcasts, 2 steps x 2 buckets all-reduces.
if run accum 2 cudafake:cuda '{ name = "ddpfake:ddp"; bucket_mb = 0.1; }' 64 \
     "limit_train_batches = 4; accumulate_grad_batches = 2;"; then
  expect_counts accum 2 4 2
  cmp -s "$tmp/accum/w.0" "$tmp/accum/w.1" || fail "accum (2 buckets): ranks 0 and 1 end with different weights"
else
  cat "$tmp/accum/log"; fail "the 2-bucket accumulating NCCL run failed"
fi

# (l) a layout with a gap: a hidden width of 60 pads the first bias to 64
# floats in the host's arena, so with bucket_mb 0.1 the first bucket (part
# of the first weight) runs in place, queued, and the second (the rest of
# it, the bias, the gap, the second layer) is packed into the device bucket
# after it: both paths in one step, against the real ddp over MPI.
LAYERS='[784, 60, 10]' run mpigap 2 cpu '{ name = "ddp"; bucket_mb = 0.1; }' 64 "limit_train_batches = 5;" ||
  { cat "$tmp/mpigap/log"; exit 1; }
if LAYERS='[784, 60, 10]' run gap 2 cudafake:cuda '{ name = "ddpfake:ddp"; bucket_mb = 0.1; }' 64 \
     "limit_train_batches = 5;"; then
  expect_counts gap 2 10 2
  expect_in_place gap 2 6
  cmp -s "$tmp/gap/w.0" "$tmp/gap/w.1" || fail "gap: ranks 0 and 1 end with different weights"
  close "$tmp/mpigap/w.0" "$tmp/gap/w.0" 1e-5 "real ddp over MPI vs NCCL, a staged and an in-place bucket" ||
    fail "gap: NCCL with a staged and an in-place bucket differs from the real ddp over MPI"
else
  cat "$tmp/gap/log"; fail "(l) the NCCL run with a staged bucket failed"
fi

# (e) one process: still NCCL (device memory), the same as the 1-process run.
# Under AddressSanitizer, LeakSanitizer's exit-time stop-the-world can crash
# here ("Tracer caught signal 11"): kiln initialises MPI itself (a singleton,
# whose helper threads start first), and the fake CUDA and NCCL libraries,
# which have thread-local storage, are dlopen'd after those threads exist —
# the LSan limitation behind the cpu accelerator's OpenBLAS-under-ASan rule.
# Leaks of this code are checked by the 2-rank cases above and tests/ddp.
asan_saved=${ASAN_OPTIONS-}
[ -n "$asan_saved" ] && export ASAN_OPTIONS="$asan_saved:detect_leaks=0"
run one 0 cudafake:cuda '"ddpfake:ddp"' 64 "limit_train_batches = 5;"
one_rc=$?
[ -n "$asan_saved" ] && export ASAN_OPTIONS="$asan_saved"
if [ "$one_rc" = 0 ]; then
  expect_nccl_line one 1
  expect_counts one 1 5 1
  close "$tmp/ref64/w.0" "$tmp/one/w.0" 1e-6 "1 process x 64 (cpu) vs NCCL world 1" ||
    fail "world 1 on NCCL differs from the 1-process cpu run"
else
  cat "$tmp/one/log"; fail "(e) the 1-process NCCL run failed"
fi

# (f) rank 1 stops itself at the start of batch 3, so rank 0's next collective
# is that batch's all-reduce (the host reduces should_stop at every batch end:
# stopping there would catch MPI's timeout instead, as would a metric
# reduction, hence log_every_n_steps 1000); rank 0 must fail in 3 s.
t0=$(date +%s)
LOGN=1000 run hang 2 cudafake:cuda '{ name = "ddpfake:ddp"; timeout_s = 3.0; }' 64 "limit_train_batches = 12;" \
  ', { name = "killer"; every = 0; kill_at = "batch_start"; kill_epoch = 0; kill_batch = 3; signal = "STOP"; rank = 1; }'
status=$? took=$(($(date +%s) - t0))
[ "$status" -ne 0 ] || fail "(f) the job with a stopped rank exited 0"
[ "$status" -ne 137 ] || fail "(f) the job hung until the 120 s limit"
if grep -q "rank 0 of 2: ncclAllReduce(gradients, AVG) did not complete within timeout_s = 3 s.*NCCL communicator aborted" "$tmp/hang/log"; then
  echo "  hang: rank 0 timed out in $took s: $(grep -o 'rank 0 of 2: [^:]* did not complete' "$tmp/hang/log" | head -1)"
else
  cat "$tmp/hang/log"; fail "(f) no NCCL watchdog timeout message naming rank 0"
fi

# (g) torchrun's variables instead of OpenMPI's (mpirun only starts the
# processes and carries the fake's transport).
cat > "$tmp/as_torchrun" <<'SH'
#!/usr/bin/env bash
r=$OMPI_COMM_WORLD_RANK n=$OMPI_COMM_WORLD_SIZE l=$OMPI_COMM_WORLD_LOCAL_RANK
unset OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK
export RANK=$r WORLD_SIZE=$n LOCAL_RANK=$l MASTER_ADDR=127.0.0.1 MASTER_PORT=$KILN_TEST_PORT
exec "$@"
SH
chmod +x "$tmp/as_torchrun"
export KILN_TEST_PORT=$((20000 + RANDOM % 30000))
if WRAP="$tmp/as_torchrun" run tcp 2 cudafake:cuda '{ name = "ddpfake:ddp"; bootstrap = "tcp"; }' 64 \
     "limit_train_batches = 5;" ", { name = \"collfix\"; path = \"$tmp/tcp/coll\"; }, { name = \"bcastfix\"; path = \"$tmp/tcp/bc\"; bytes = 65536; }"; then
  for r in 0 1; do
    grep -qx "ok $r" "$tmp/tcp/bc.$r" 2>/dev/null || fail "(g) bcastfix on rank $r: the 64 KiB broadcast from rank 0 did not arrive intact"
    grep -q "ddp: rank $r of 2 (local rank $r) from torchrun-style (RANK/WORLD_SIZE/LOCAL_RANK); no MPI: rendezvous over TCP at 127.0.0.1:$KILN_TEST_PORT" "$tmp/tcp/log" ||
      fail "(g) rank $r did not log the TCP rendezvous"
    grep -qx "ok $r 2" "$tmp/tcp/coll.$r" 2>/dev/null || fail "(g) collfix on rank $r: $(cat "$tmp/tcp/coll.$r" 2>&1)"
    c=$(sed -n "s/^fake-nccl: rank $r of 2: allreduce \([0-9]*\) ([0-9]* bytes, \([0-9]*\) avg), broadcast \([0-9]*\) .*allgather \([0-9]*\).*/\1 \2 \3 \4/p" "$tmp/tcp/log" | head -1)
    read -r n_all n_avg n_bc n_ag <<< "${c:-0 0 0 0}"
    [ "$n_avg" = 5 ] || fail "(g) rank $r: $n_avg gradient all-reduces (ncclAvg), expected 5"
    [ "$n_all" -gt 5 ] || fail "(g) rank $r: no metric or barrier all-reduce on NCCL ($n_all all-reduces in all)"
    [ "$n_bc" -ge 2 ] && [ "$n_ag" -ge 1 ] || fail "(g) rank $r: collfix's broadcast/all_gather not on NCCL ('$c')"
    cmp -s "$tmp/nccl/w.$r" "$tmp/tcp/w.$r" || fail "(g) rank $r: weights differ from the MPI-bootstrapped NCCL run"
  done
  echo "  tcp: rendezvous at 127.0.0.1:$KILN_TEST_PORT, $n_all all-reduces ($n_avg avg), $n_bc broadcasts, $n_ag all-gathers on rank 1; weights = MPI bootstrap's"
else
  cat "$tmp/tcp/log"; fail "(g) the 2-rank launch without MPI failed"
fi

# Without KILN_RDZV_SECRET rank 0 warns, once, that the rendezvous is
# unauthenticated; with it on both ranks the same job trains to the same
# weights, silently (the HMAC handshake of ddp_tcp.c, tests/ddp/test_ddp_tcp.c).
n_warn=$(grep -c "KILN_RDZV_SECRET is unset: the TCP rendezvous at 127.0.0.1:$KILN_TEST_PORT is unauthenticated" "$tmp/tcp/log")
[ "$n_warn" = 1 ] || fail "(g) without KILN_RDZV_SECRET: $n_warn warnings about the unauthenticated rendezvous, expected 1"
export KILN_TEST_PORT=$((KILN_TEST_PORT + 1))
if KILN_RDZV_SECRET=fake-nccl-test-secret-$RANDOM$RANDOM WRAP="$tmp/as_torchrun" run tcpauth 2 cudafake:cuda \
     '{ name = "ddpfake:ddp"; bootstrap = "tcp"; }' 64 "limit_train_batches = 5;"; then
  grep -q "unauthenticated" "$tmp/tcpauth/log" && fail "(g) with KILN_RDZV_SECRET: still warned about an unauthenticated rendezvous"
  for r in 0 1; do
    cmp -s "$tmp/nccl/w.$r" "$tmp/tcpauth/w.$r" || fail "(g) authenticated rendezvous: rank $r's weights differ from the MPI bootstrap's"
  done
  echo "  tcp with KILN_RDZV_SECRET: authenticated rendezvous, same weights"
else
  cat "$tmp/tcpauth/log"; fail "(g) the 2-rank launch without MPI with KILN_RDZV_SECRET failed"
fi

# Under Slurm without MPI (srun --mpi=none, bootstrap "tcp"): ranks from
# SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID, the rendezvous at the first host
# of SLURM_JOB_NODELIST, on port 20000 + SLURM_JOB_ID % 20000.
cat > "$tmp/as_slurm" <<'SH'
#!/usr/bin/env bash
r=$OMPI_COMM_WORLD_RANK n=$OMPI_COMM_WORLD_SIZE l=$OMPI_COMM_WORLD_LOCAL_RANK
unset OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK
export SLURM_PROCID=$r SLURM_NTASKS=$n SLURM_LOCALID=$l SLURM_JOB_NODELIST="localhost,nodeb[01-02]" SLURM_JOB_ID=$KILN_TEST_JOB
exec "$@"
SH
chmod +x "$tmp/as_slurm"
export KILN_TEST_JOB=$((100000 + RANDOM)) # port 20000 + id % 20000
slurm_port=$((20000 + KILN_TEST_JOB % 20000))
if WRAP="$tmp/as_slurm" run slurmtcp 2 cudafake:cuda '{ name = "ddpfake:ddp"; bootstrap = "tcp"; }' 64 "limit_train_batches = 5;"; then
  for r in 0 1; do
    grep -q "ddp: rank $r of 2 (local rank $r) from Slurm (SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID); no MPI: rendezvous over TCP at localhost:$slurm_port" "$tmp/slurmtcp/log" ||
      fail "(g) Slurm without MPI: rank $r did not log the rendezvous at localhost:$slurm_port"
    cmp -s "$tmp/nccl/w.$r" "$tmp/slurmtcp/w.$r" || fail "(g) Slurm without MPI: rank $r's weights differ from the MPI bootstrap's"
  done
  grep -q "rendezvous host from SLURM_JOB_NODELIST, port from SLURM_JOB_ID" "$tmp/slurmtcp/log" ||
    fail "(g) Slurm without MPI: no line saying where the rendezvous host and port came from"
  echo "  Slurm variables without MPI: rendezvous at localhost:$slurm_port (first host, 20000 + job id % 20000), same weights"
else
  cat "$tmp/slurmtcp/log"; fail "(g) the 2-rank Slurm launch without MPI failed"
fi

# The real ddp on the cpu accelerator cannot take a launch without MPI: one clear line.
if WRAP="$tmp/as_torchrun" run tcpcpu 2 cpu '{ name = "ddp"; bootstrap = "tcp"; }' 64 "limit_train_batches = 2;"; then
  fail "(g) bootstrap tcp on the cpu accelerator did not fail"
elif grep -q 'runs every collective on NCCL and needs' "$tmp/tcpcpu/log"; then
  echo "  tcp on cpu: $(grep -o 'ddp: rank 0: a launch without MPI[^;]*' "$tmp/tcpcpu/log" | head -1)"
else
  cat "$tmp/tcpcpu/log"; fail "(g) no clear message for bootstrap tcp on the cpu accelerator"
fi

# bootstrap "auto": torchrun's variables with MASTER_ADDR/MASTER_PORT and no
# MPI launcher choose tcp (on the cpu accelerator: the refusal above); the
# same variables without MASTER_ADDR join MPI (a singleton here) and train.
if RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$KILN_TEST_PORT \
   run autotcp 0 cpu '"ddp"' 64 "limit_train_batches = 2;"; then
  fail "(g) auto with torchrun's variables and no MPI did not choose tcp"
else
  grep -q "no MPI: rendezvous over TCP at 127.0.0.1:$KILN_TEST_PORT" "$tmp/autotcp/log" ||
    { cat "$tmp/autotcp/log"; fail "(g) auto did not log the TCP rendezvous"; }
fi
if RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 run automp 0 cpu '"ddp"' 64 "limit_train_batches = 2;"; then
  grep -q "from torchrun-style (RANK/WORLD_SIZE/LOCAL_RANK); MPI initialised here" "$tmp/automp/log" ||
    { cat "$tmp/automp/log"; fail "(g) auto without MASTER_ADDR did not join MPI"; }
else
  cat "$tmp/automp/log"; fail "(g) auto without MASTER_ADDR failed"
fi

# (h) 16-mixed from a scale that overflows: an inf on either rank reaches
# both through the NCCL average, the cuda accelerator's unscale_check sees
# it on both, and both skip the same steps and end byte-identical.
if PREC='{ name = "16-mixed"; init_scale = 16777216.0; }' run amp 2 cudafake:cuda '"ddpfake:ddp"' 64 \
    "limit_train_batches = 10;"; then
  sk=$(sed -n 's/.*skipped steps: \([0-9]*\).*/\1/p' "$tmp/amp/log" | head -1)
  [ -n "$sk" ] && [ "$sk" -gt 0 ] || fail "(h) 16-mixed: expected skipped steps, found '$sk'"
  cmp -s "$tmp/amp/w.0" "$tmp/amp/w.1" || fail "(h) 16-mixed: the ranks differ"
  grep -q "contract violation" "$tmp/amp/log" && fail "(h) $(grep -m1 'contract violation' "$tmp/amp/log")"
  echo "  amp: 16-mixed on 2 ranks over NCCL: $sk skipped steps, ranks identical"
else
  cat "$tmp/amp/log"; fail "(h) 16-mixed under ddp on NCCL failed"
fi

# (i) asynchronous errors on rank 0's third collective (the second gradient
# all-reduce): the fake never issues it, so rank 1's stays pending as it
# would with a dead peer. Rank 0 must abort at once (not wait out
# timeout_s = 60: the job ends well before it, 40 s leaving room for a
# loaded machine's start-up under the sanitizers), say what failed in one
# line, and the fake must see ncclCommAbort, never ncclCommDestroy (which
# would hang on real NCCL).
async_case() { # TAG SPEC PATTERN [WRAP BOOT]
  local tag=$1 spec=$2 pat=$3 t0 status took
  t0=$(date +%s)
  KILN_FAKE_NCCL_FAIL=$spec TMO=120 WRAP=${4:-} run "$tag" 2 cudafake:cuda \
    "{ name = \"ddpfake:ddp\"; timeout_s = 60.0; bootstrap = \"${5:-mpi}\"; }" 64 "limit_train_batches = 6;"
  status=$? took=$(($(date +%s) - t0))
  [ "$status" -ne 0 ] || fail "(i) $tag: the job with an injected $spec exited 0"
  [ "$status" -ne 137 ] || fail "(i) $tag: the job hung until the 120 s limit"
  [ "$took" -lt 40 ] || fail "(i) $tag: took $took s: rank 0 waited for the timeout instead of aborting at once"
  if grep -q "$pat" "$tmp/$tag/log"; then
    echo "  $tag ($spec, $took s): $(grep -o "$pat" "$tmp/$tag/log" | head -1)"
  else
    cat "$tmp/$tag/log"; fail "(i) $tag: no line matching '$pat'"
  fi
  grep -q "^fake-nccl: rank 0 of 2: .*aborted$" "$tmp/$tag/log" || fail "(i) $tag: rank 0's communicator was not aborted"
  grep -q "^fake-nccl: rank 0 of 2: .*destroyed$" "$tmp/$tag/log" && fail "(i) $tag: rank 0's communicator was destroyed, not aborted"
}
async_case remote remote:0:3 "ddp: rank 0 of 2: ncclAllReduce(gradients, AVG) failed: remote process exited.*NCCL communicator aborted"
async_case system system:0:3 "ddp: rank 0 of 2: ncclAllReduce(gradients, AVG) failed: unhandled system error.*NCCL communicator aborted"
async_case kernel stream:0:3 "ddp: rank 0 of 2: ncclAllReduce(gradients, AVG) failed on NCCL's stream: cudaStreamQuery: unspecified launch failure.*NCCL communicator aborted"
# without MPI the host's later collectives (metrics, barriers) run on NCCL
# too: after the abort they fail at once
async_case remotetcp remote:0:3 "ddp: rank 0 of 2: ncclAllReduce(gradients, AVG) failed: remote process exited.*NCCL communicator aborted" \
  "$tmp/as_torchrun" tcp

# (j) rank 1 stops (SIGSTOP) on entering NCCL's init, after the id
# exchange: rank 0's non-blocking init must end after timeout_s = 3.
t0=$(date +%s)
KILN_FAKE_NCCL_FAIL=initstop:1 TMO=60 run initstop 2 cudafake:cuda '{ name = "ddpfake:ddp"; timeout_s = 3.0; }' 64 \
  "limit_train_batches = 2;"
status=$? took=$(($(date +%s) - t0))
[ "$status" -ne 0 ] || fail "(j) the job with a rank stopped before NCCL's init exited 0"
[ "$status" -ne 137 ] || fail "(j) the job hung in NCCL's init until the 60 s limit"
pat="ddp: rank 0 of 2: NCCL's communicator init (ncclCommInitRankConfig, 2 ranks) did not complete within timeout_s = 3 s (waited [0-9.]* s)"
if grep -q "$pat" "$tmp/initstop/log"; then
  echo "  initstop ($took s): $(grep -o "$pat" "$tmp/initstop/log" | head -1)"
else
  cat "$tmp/initstop/log"; fail "(j) no init timeout line naming rank 0, the world size and the seconds waited"
fi

# (k) rank 0's ncclGetUniqueId fails: it sends its error where the id would
# go, so rank 1 stops at once (timeout_s = 60 is never waited out), over
# MPI and over the TCP rendezvous.
for boot in mpi tcp; do
  w=; [ "$boot" = tcp ] && w="$tmp/as_torchrun"
  t0=$(date +%s)
  KILN_FAKE_NCCL_FAIL=uniqueid:0 TMO=50 WRAP=$w run "uid$boot" 2 cudafake:cuda \
    "{ name = \"ddpfake:ddp\"; timeout_s = 60.0; bootstrap = \"$boot\"; }" 64 "limit_train_batches = 2;"
  status=$? took=$(($(date +%s) - t0))
  [ "$status" -ne 0 ] || fail "(k) $boot: the job with a failing ncclGetUniqueId exited 0"
  [ "$status" -ne 137 ] || fail "(k) $boot: rank 1 waited for an id that never came (killed at 50 s)"
  grep -q "ddp: rank 0 of 2: ncclGetUniqueId failed: .*the other ranks were told" "$tmp/uid$boot/log" ||
    { cat "$tmp/uid$boot/log"; fail "(k) $boot: no ncclGetUniqueId line on rank 0"; }
  pat="ddp: rank 1 of 2: rank 0 could not create NCCL's unique id (ncclGetUniqueId failed: .*); no NCCL communicator"
  [ "$took" -lt 30 ] || fail "(k) $boot: took $took s: rank 1 waited for the id"
  # rank 1's own line comes last, after its teardown, and mpirun may end
  # the job on rank 0's exit before it is printed; its teardown line shows
  # that it left the id exchange (waiting there, it never gets that far)
  if grep -q "$pat" "$tmp/uid$boot/log"; then
    echo "  uid over $boot ($took s): $(grep -o "$pat" "$tmp/uid$boot/log" | head -1)"
  elif grep -q "ddp: rank 1: 0 broadcasts" "$tmp/uid$boot/log"; then
    echo "  uid over $boot ($took s): rank 1 left the id exchange at once (its error line lost to mpirun's teardown)"
  else
    cat "$tmp/uid$boot/log"; fail "(k) $boot: rank 1 did not learn of rank 0's failure"
  fi
done

# No run may do what real NCCL would not survive, or what the fake CUDA
# runtime flags (a collective taking a buffer whose kernels the host has
# not waited for, a kernel on a buffer a collective still holds, ...).
for f in $(grep -lE "fake-nccl: contract violation|fake cuda: contract violation" "$tmp"/*/log 2>/dev/null); do
  fail "$(basename "$(dirname "$f")"): $(grep -m1 -E 'fake-nccl: contract violation|fake cuda: contract violation' "$f")"
done

[ "$fails" -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "ddp over fake NCCL: counts, equivalence, world 1, timeout, the launch without MPI, 16-mixed, asynchronous errors, the init deadline and a failed unique id ok"
