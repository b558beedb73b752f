#!/usr/bin/env bash
# tests/gpu/configs.sh — every `kiln fit` the GPU run makes, checked without
# a GPU: tests/gpu/run.sh (steps fashion, gpt, gpt2, bench, so also
# gpt_checks.sh and bench/gpu/*.sh) runs on a stand-in machine whose kiln
# turns each `fit` into `kiln config check` with the same run file and
# --set arguments, answered by the real kiln and its plugins (the cuda
# accelerator's keys included). A run file or --set the real kiln would
# refuse on the GPU machine (an unknown key, a section where the file has
# a string) then fails here, before any device time is spent on it.
#   configs.sh BUILD   (a build with the cuda accelerator; KEEP=1 keeps
#                      the scratch folder, whose run.txt is run.sh's log)
# No run leaves figures there, so every check that judges one must fail.
# Exit 0 when every fit was accepted, there were at least as many as
# expected and no such check passed; 77 (skipped) without python3 or
# timeout.
set -uo pipefail
real=$(cd "${1:?usage: configs.sh BUILD}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
command -v python3 >/dev/null && command -v timeout >/dev/null || { echo "configs.sh: needs python3 and timeout: skipped"; exit 77; }
[ -x "$real/bin/kiln" ] || { echo "configs.sh: FAIL: no $real/bin/kiln"; exit 1; }
tmp=$(mktemp -d)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$tmp"' EXIT; echo "configs.sh: scratch $tmp"
fail() { echo "configs.sh: FAIL: $*"; exit 1; }

# the stand-in checkout: the scripts and examples, and a build-gpu/ whose
# kiln is the stub below (the other binaries and the plugins are real)
root="$tmp/root"
mkdir -p "$root/tests/gpu" "$root/bench" "$root/build-gpu/bin" "$root/.gpu/fashion-mnist" "$root/.gpu/fortunes" \
  "$tmp/stubs" "$tmp/lib"
cp "$here"/*.sh "$here"/*.py "$root/tests/gpu/"
ln -s "$src/bench/gpu" "$root/bench/gpu"
ln -s "$src/examples" "$root/examples"
. "$here/standin.sh"
standin_build "$real" "$root/build-gpu"
echo "CMAKE_HOME_DIRECTORY:INTERNAL=$root" >"$root/build-gpu/CMakeCache.txt"
: >"$root/.gpu/fashion-mnist/train-images-idx3-ubyte.gz"
printf 'A fortune.\n%%\nAnother one.\n' >"$root/.gpu/fortunes/fortunes"
# where Open MPI is installed, the carried libmpi stated as its version, so
# that run.sh makes its MPI-launched ddp fit too
command -v ompi_info >/dev/null &&
  ompi_info --version 2>/dev/null | sed -n 's/.*Open MPI v\([0-9][0-9A-Za-z.]*\).*/\1/p' | head -1 >"$root/.gpu/openmpi-version"
cat >"$root/build-gpu/bin/kiln" <<SH
#!/usr/bin/env bash
# stand-in kiln: fit RUN.cfg ARGS becomes config check RUN.cfg ARGS
if [ "\$1" = fit ]; then
  shift
  args=()
  for a in "\$@"; do [ "\$a" = --test ] || args+=("\$a"); done
  echo "fit \${args[*]}" >>"$tmp/fits"
  if ! "$real/bin/kiln" config check "\${args[@]}" >"$tmp/last" 2>&1; then
    { echo "REFUSED: fit \${args[*]}"; cat "$tmp/last"; } >>"$tmp/refused"
  fi
  exit 0
fi
exec "$real/bin/kiln" "\$@"
SH
chmod +x "$root/build-gpu/bin/kiln"
standin_libs "$tmp/lib"
standin_driver "$tmp/stubs"

PATH="$tmp/stubs:$PATH" LD_LIBRARY_PATH="$tmp/lib" timeout 600 bash "$root/tests/gpu/run.sh" "$tmp/out" \
  fashion,gpt,gpt2,bench >"$tmp/run.txt" 2>&1
[ -f "$tmp/out/results.json" ] || { tail -30 "$tmp/run.txt"; fail "run.sh wrote no results.json"; }
n=$(wc -l <"$tmp/fits" 2>/dev/null || echo 0)
echo "configs.sh: $n fit(s) checked"
if [ -s "$tmp/refused" ]; then
  cat "$tmp/refused"
  fail "the real kiln refused $(grep -c '^REFUSED' "$tmp/refused") of the GPU run's $n fit(s)"
fi
# Fashion-MNIST: 5 precisions and ddp (torchrun's way; MPI's too where
# Open MPI is installed); gpt: 5 small runs, 3 fortunes runs, GPT-2 124M
# under ddp; gpt2: the batch search's first run, flash and the 2 profiled
# runs; bench: its kiln fit
for want in "precision=16-mixed" "accelerator.tf32=true" "strategy=ddp" "gpt/gpu_flash/run.cfg" \
            'attention = "flash"; }' "gpt2_124m.cfg" "profile = true; attention = \"flash\"" "fashion_mnist.cfg"; do
  grep -q -F -- "$want" "$tmp/fits" || { cat "$tmp/fits"; fail "no fit with '$want'"; }
done
[ "$n" -ge 19 ] || { cat "$tmp/fits"; fail "$n fits, expected at least 19"; }
# no run left a figure, so no check that judges one may pass: one that did
# would pass on a GPU whatever the GPU computed
python3 - "$tmp/out/results.json" <<'PY' || fail "a check passed without its figures"
import json, sys
r = json.load(open(sys.argv[1]))
setup = {"preflight", "build", "plugins_list"}
passed = [row["check"] for row in r["results"] if row["status"] == "pass" and row["check"] not in setup]
judged = [row["check"] for row in r["results"] if row["status"] == "fail"]
print("configs.sh: failed as they must:", " ".join(judged))
if passed or len(judged) < 10:
    print("configs.sh: passed with nothing to judge:", " ".join(passed))
    sys.exit(1)
PY
echo "configs.sh: ok"
