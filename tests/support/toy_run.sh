# tests/support/toy_run.sh — sourced (not run) by the shell tests that
# train the toy fixtures under ddp (tests/ddp/ddp_collectives.sh,
# ddp_launchers.sh, tests/slurm/slurm_hint.sh): the run file they all start
# from, written in one place so that a change to the fixtures' keys or the
# trainer's defaults is made once. It reads the caller's $train and $ddp
# (the fixture directories) and $tmp (the scratch directory).

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
