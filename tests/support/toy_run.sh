# tests/support/toy_run.sh — sourced (not run) by the shell tests that
# train the toy fixtures: the run files they start from, written in one
# place so that a change to the fixtures' keys or the trainer's defaults is
# made once. toy_run is the ddp tests' (tests/ddp/ddp_collectives.sh,
# ddp_launchers.sh, tests/slurm/slurm_hint.sh), from the caller's $train
# and $ddp (the fixture directories) and $tmp (the scratch directory);
# toy_fit the single-process one of ckpt_checksum.sh and
# plugin_isolation/isolation.sh, under the caller's $W.

# toy_run FILE N_TRAIN N_VAL [LINE...]: one epoch of toydata (N_TRAIN and
# N_VAL batches), toymod and sgd, no sanity check, one thread, runs under
# $tmp/runs, plugins from $train and $ddp; each LINE (a strategy, the
# callbacks) follows on a line of its own.
toy_run() {
  local file=$1 n_train=$2 n_val=$3
  shift 3
  {
    printf 'plugins = { dirs = ["%s", "%s"]; };\n' "$train" "$ddp"
    printf 'trainer = { max_epochs = 1; num_sanity_val_steps = 0; default_root_dir = "%s/runs"; threads = 1; };\n' "$tmp"
    printf 'data = { name = "toydata"; n_train = %s; n_val = %s; };\n' "$n_train" "$n_val"
    printf '%s\n' 'module = { name = "toymod"; };' 'optimizer = { name = "sgd"; lr = 0.1; };' "$@"
  } > "$file"
}

# toy_fit FILE OPTIMIZER: one epoch, seed 3, of toydata (4 + 2 batches) and
# toymod under OPTIMIZER (its "{ ... }"), runs under $W/runs, the plugins
# from wherever the caller's kiln looks; the optimizer line stands alone
# (isolation.sh appends its callbacks after it).
toy_fit() {
  {
    printf 'trainer = { max_epochs = 1; seed = 3; default_root_dir = "%s/runs"; };\n' "$W"
    printf '%s\n' 'data = { name = "toydata"; n_train = 4; n_val = 2; };' 'module = { name = "toymod"; };' "optimizer = $2;"
  } > "$1"
}
