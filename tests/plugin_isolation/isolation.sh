#!/bin/bash
# tests/plugin_isolation/isolation.sh KILN ISO_FIXTURES TRAIN_FIXTURES WORKDIR
# — one broken plugin on the search path must not take every command down.
# A private plugin folder holds four hostile libraries (segfault in a
# constructor, segfault in init, exit(0) in init, endless loop in init), a
# good one and the toy data and module. Then:
#  - `plugins list` succeeds, shows the good plugins and names every broken
#    file (without --verbose), within the probe time limit;
#  - `fit` of a run that uses none of them succeeds, and loads into the
#    process only the plugins it uses (KILN_PLUGIN_DEBUG trace);
#  - `fit` of a run naming one fails non-zero with one error line naming the
#    file (exit(0) in init included: it must not end `fit` with status 0);
#  - `plugins check` fails on each (exit(0) included: the verdict is the
#    child's report, not its exit status) within its time limit, and passes
#    the good one;
#  - the probe cache (KILN_PLUGIN_CACHE, here a private file): a warm
#    command forks no probe for an unchanged file, a touched file is probed
#    again, and cached crash verdicts still refuse their files;
#  - a bad KILN_PLUGIN_PROBE_TIMEOUT or KILN_PLUGIN_CACHE is one error line
#    and exit status 2.
set -u
KILN=$1 ISO=$2 TRAIN=$3 W=$4
rm -rf "$W"
mkdir -p "$W/plugins" "$W/runs"
chmod 755 "$W" "$W/plugins"
for n in ctorsegv initsegv initexit initloop goodcb; do cp "$ISO/libkiln-$n.so" "$W/plugins/"; done
cp "$TRAIN/libkiln-toydata.so" "$TRAIN/libkiln-toymod.so" "$W/plugins/"
export KILN_PLUGIN_PATH="$W/plugins"
export KILN_PLUGIN_PROBE_TIMEOUT=2
export KILN_PLUGIN_CACHE="$W/probe-cache"
unset KILN_PLUGIN_DEBUG KILN_LOG
HOSTILE="ctorsegv initsegv initexit initloop"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
now() { date +%s.%N; }
# elapsed START LIMIT WHAT: fail when more than LIMIT seconds passed
elapsed() { awk -v a="$1" -v b="$(now)" -v l="$2" 'BEGIN { exit !(b - a <= l) }' || fail "$3 took more than $2 s"; }

# ---- plugins list
t=$(now)
"$KILN" plugins list > "$W/list.out" 2> "$W/list.err"
rc=$?
elapsed "$t" 12 "plugins list"
[ $rc -eq 0 ] || { fail "plugins list exited $rc"; cat "$W/list.err"; }
for n in goodcb toydata toymod; do grep -qE "^  [a-z]+ +$n " "$W/list.out" || fail "plugins list does not show '$n'"; done
for n in $HOSTILE; do
  grep -q "refused" "$W/list.out" && grep -qF "$W/plugins/libkiln-$n.so: " "$W/list.out" ||
    fail "plugins list does not name the broken $W/plugins/libkiln-$n.so"
done
grep -qF "libkiln-initloop.so: did not finish loading and initialising within 2 s" "$W/list.out" ||
  fail "plugins list: no time-limit reason for initloop"
grep -qF "libkiln-initexit.so: exited the process (status 0)" "$W/list.out" || fail "plugins list: no exit reason for initexit"
"$KILN" plugins list --json > "$W/list.json" 2> /dev/null || fail "plugins list --json failed"
python3 - "$W/list.json" "$W/plugins" <<'PY' || fail "plugins list --json: wrong content"
import json, sys
d = json.load(open(sys.argv[1]))
st = {c["path"].rsplit("/", 1)[-1]: c["status"] for c in d["candidates"] if c["path"].startswith(sys.argv[2] + "/")}
for n in ("ctorsegv", "initsegv", "initexit", "initloop"):
    assert st["libkiln-%s.so" % n] == "refused", st
for n in ("goodcb", "toydata", "toymod"):
    assert st["libkiln-%s.so" % n] == "ok", st
assert {"goodcb", "toydata", "toymod"} <= {p["name"] for p in d["plugins"]}
PY

# ---- fit without the hostile plugins
. "$(dirname "${BASH_SOURCE[0]}")/../support/toy_run.sh"
toy_fit "$W/run.cfg" '{ name = "sgd"; lr = 0.1; }'
t=$(now)
KILN_PLUGIN_DEBUG=1 "$KILN" fit "$W/run.cfg" > "$W/fit.out" 2> "$W/fit.err"
rc=$?
elapsed "$t" 12 "fit"
[ $rc -eq 0 ] || { fail "fit of a run without the hostile plugins exited $rc"; cat "$W/fit.err"; }
grep -q "fit:" "$W/fit.out" || grep -q "fit" "$W/fit.out" || fail "fit printed no summary"
# loaded into this process: exactly what the run uses (from this folder, the toy data and module)
grep -qF "into this process: $W/plugins/libkiln-toymod.so" "$W/fit.err" || fail "toymod was not loaded in-process"
grep -qF "into this process: $W/plugins/libkiln-goodcb.so" "$W/fit.err" && fail "fit loaded goodcb, which the run does not use"
grep -qF "probed $W/plugins/libkiln-goodcb.so" "$W/fit.err" || fail "goodcb was not probed"
for n in $HOSTILE; do
  grep -qF "$W/plugins/libkiln-$n.so" "$W/fit.err" || fail "fit does not warn about $W/plugins/libkiln-$n.so"
done

# ---- the probe cache: written by the first commands, used by the next
[ -f "$W/probe-cache" ] || fail "no probe cache written at $W/probe-cache"
KILN_PLUGIN_DEBUG=1 "$KILN" fit "$W/run.cfg" > "$W/warm.out" 2> "$W/warm.err" || { fail "warm fit failed"; cat "$W/warm.err"; }
grep -qF "probe of $W/plugins/libkiln-goodcb.so: from the cache" "$W/warm.err" || fail "warm fit probed goodcb again"
grep -qF "probe of $W/plugins/libkiln-ctorsegv.so: from the cache" "$W/warm.err" || fail "warm fit probed ctorsegv again"
# (a sanitizer build turns the SIGSEGV into exit status 1: either reason will do)
grep -qE "/libkiln-ctorsegv.so: (crashed|exited the process)" "$W/warm.err" || fail "warm fit does not warn about ctorsegv"
touch "$W/plugins/libkiln-goodcb.so"
KILN_PLUGIN_DEBUG=1 "$KILN" plugins list > /dev/null 2> "$W/touched.err"
grep -qF "probed $W/plugins/libkiln-goodcb.so" "$W/touched.err" || fail "a touched file was not probed again"
KILN_PLUGIN_CACHE=off KILN_PLUGIN_DEBUG=1 "$KILN" plugins list > /dev/null 2> "$W/off.err"
grep -qF "probed $W/plugins/libkiln-toymod.so" "$W/off.err" || fail "KILN_PLUGIN_CACHE=off still used the cache"

# ---- fit of a run that names a hostile plugin: one line naming the file
for n in $HOSTILE; do
  sed "s/^optimizer = .*/&\ncallbacks = ( \"$n\" );/" "$W/run.cfg" > "$W/run-$n.cfg"
  "$KILN" -q fit "$W/run-$n.cfg" > "$W/fit-$n.out" 2> "$W/fit-$n.err"
  rc=$?
  if [ $rc -eq 0 ]; then fail "fit of a run using $n exited 0"
  elif [ "$(grep -c 'kiln: error:' "$W/fit-$n.err")" -ne 1 ] ||
       ! grep 'kiln: error:' "$W/fit-$n.err" | grep -qF "$W/plugins/libkiln-$n.so: "; then
    fail "fit using $n: expected one error line naming $W/plugins/libkiln-$n.so, got:"; cat "$W/fit-$n.err"
  fi
done

# ---- plugins check
for n in $HOSTILE; do
  t=$(now)
  "$KILN" plugins check "$W/plugins/libkiln-$n.so" > "$W/check-$n.out" 2> "$W/check-$n.err"
  rc=$?
  elapsed "$t" 6 "plugins check libkiln-$n.so"
  if [ $rc -eq 0 ]; then fail "plugins check passed libkiln-$n.so"
  elif ! grep -qF "kiln: error: $W/plugins/libkiln-$n.so: " "$W/check-$n.err"; then
    fail "plugins check libkiln-$n.so: no error line naming it:"; cat "$W/check-$n.err"
  fi
done
"$KILN" plugins check "$W/plugins/libkiln-goodcb.so" > "$W/check-good.out" 2>&1 || { fail "plugins check failed the good plugin"; cat "$W/check-good.out"; }

# ---- a bad time limit is refused
KILN_PLUGIN_PROBE_TIMEOUT=soon "$KILN" plugins list > /dev/null 2> "$W/tmo.err"
rc=$?
[ $rc -eq 2 ] && [ "$(wc -l < "$W/tmo.err")" -eq 1 ] && grep -qF "KILN_PLUGIN_PROBE_TIMEOUT: expected seconds" "$W/tmo.err" ||
  { fail "KILN_PLUGIN_PROBE_TIMEOUT=soon: expected exit 2 and one line, got $rc:"; cat "$W/tmo.err"; }
KILN_PLUGIN_PROBE_TIMEOUT=0 "$KILN" -q fit "$W/run.cfg" > /dev/null 2> "$W/tmo.err"
[ $? -ne 0 ] && grep -qF "KILN_PLUGIN_PROBE_TIMEOUT" "$W/tmo.err" || fail "KILN_PLUGIN_PROBE_TIMEOUT=0 accepted by fit"
KILN_PLUGIN_CACHE=relative/file "$KILN" plugins list > /dev/null 2> "$W/cache.err"
rc=$?
[ $rc -eq 2 ] && [ "$(wc -l < "$W/cache.err")" -eq 1 ] && grep -qF "KILN_PLUGIN_CACHE: expected an absolute file path or 'off'" "$W/cache.err" ||
  { fail "KILN_PLUGIN_CACHE=relative/file: expected exit 2 and one line, got $rc:"; cat "$W/cache.err"; }

[ $fails -eq 0 ] && echo "plugin_isolation: all checks passed"
exit $fails
