#!/bin/bash
# tests/ckpt_checksum/ckpt_checksum.sh KILN WORKDIR — a flipped bit in a
# checkpoint's weight or state blob is refused by every command that reads
# it, in one line naming the file and the tensor; a checkpoint without
# checksum entries (older kiln, other tools) still loads. Needs python3 (the
# base dependencies have it) to find the tensors' bytes in the file.
set -u
KILN=$1
W=$2
rm -rf "$W"
mkdir -p "$W"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

. "$(dirname "${BASH_SOURCE[0]}")/../support/toy_run.sh"
toy_fit "$W/run.cfg" '{ name = "adamw"; lr = 0.01; }'
"$KILN" -q fit "$W/run.cfg" > "$W/fit.out" 2>&1 || { cat "$W/fit.out"; echo "FAIL: the first fit"; exit 1; }
CK="$W/runs/version_0/checkpoints/last.safetensors"
[ -f "$CK" ] || { echo "FAIL: no checkpoint at $CK"; exit 1; }

# flip.py SRC DST WHICH: WHICH = weight (the first tensor that is not a state
# blob) or state (__state__.optimizer) gets one bit flipped in its first
# byte; strip rewrites the header without the kiln.xxh3.* entries. Prints the
# tensor's name.
cat > "$W/flip.py" <<'PY'
import json, struct, sys
src, dst, which = sys.argv[1:4]
b = bytearray(open(src, 'rb').read())
n = struct.unpack('<Q', b[:8])[0]
hdr = json.loads(b[8:8 + n].decode('utf-8'))
meta = hdr.get('__metadata__', {})
assert any(k.startswith('kiln.xxh3.') for k in meta), 'no checksums written'
if which == 'strip':
    hdr['__metadata__'] = {k: v for k, v in meta.items() if not k.startswith('kiln.xxh3.')}
    j = json.dumps(hdr, separators=(',', ':')).encode()
    j += b' ' * ((8 - len(j) % 8) % 8)
    open(dst, 'wb').write(struct.pack('<Q', len(j)) + j + bytes(b[8 + n:]))
    print('-')
    sys.exit(0)
names = [k for k in hdr if k != '__metadata__' and hdr[k]['data_offsets'][1] > hdr[k]['data_offsets'][0]]
name = '__state__.optimizer' if which == 'state' else [k for k in names if not k.startswith('__state__.')][0]
s = hdr[name]['data_offsets'][0]
b[8 + n + s] ^= 0x04
open(dst, 'wb').write(b)
print(name)
PY
wname=$(python3 "$W/flip.py" "$CK" "$W/weight-flip.safetensors" weight) || { echo "FAIL: flip.py"; exit 1; }
sname=$(python3 "$W/flip.py" "$CK" "$W/state-flip.safetensors" state) || { echo "FAIL: flip.py"; exit 1; }
python3 "$W/flip.py" "$CK" "$W/plain.safetensors" strip > /dev/null || { echo "FAIL: flip.py strip"; exit 1; }

# expect_refused FILE TENSOR ARGS...: non-zero, exactly one line, naming both
expect_refused() {
  local file=$1 tensor=$2
  shift 2
  "$KILN" -q "$@" > "$W/out" 2> "$W/err"
  local rc=$?
  local want="$file: tensor '$tensor': checksum mismatch (stored "
  if [ $rc -eq 0 ]; then fail "kiln $* accepted a damaged checkpoint"
  elif [ "$(wc -l < "$W/err")" -ne 1 ] || ! grep -qF -- "$want" "$W/err" || ! grep -qF "the file is damaged" "$W/err"; then
    fail "kiln $*: expected one line with \"$want\", got:"; cat "$W/err"
  fi
}
R=(--set "trainer.default_root_dir=\"$W/runs2\"")
expect_refused "$W/weight-flip.safetensors" "$wname" fit "$W/run.cfg" "${R[@]}" --set trainer.max_epochs=2 --ckpt "$W/weight-flip.safetensors"
expect_refused "$W/weight-flip.safetensors" "$wname" fit "$W/run.cfg" "${R[@]}" --ckpt "$W/weight-flip.safetensors" --weights-only
expect_refused "$W/weight-flip.safetensors" "$wname" test "$W/run.cfg" --ckpt "$W/weight-flip.safetensors"
expect_refused "$W/weight-flip.safetensors" "$wname" validate "$W/run.cfg" --ckpt "$W/weight-flip.safetensors"
expect_refused "$W/state-flip.safetensors" "$sname" fit "$W/run.cfg" "${R[@]}" --set trainer.max_epochs=2 --ckpt "$W/state-flip.safetensors"
expect_refused "$W/state-flip.safetensors" "$sname" test "$W/run.cfg" --ckpt "$W/state-flip.safetensors"
[ "$sname" = "__state__.optimizer" ] || fail "the state blob is '$sname', expected __state__.optimizer"

# the intact checkpoint and the one without checksums both resume and test
for f in "$CK" "$W/plain.safetensors"; do
  "$KILN" -q fit "$W/run.cfg" "${R[@]}" --set trainer.max_epochs=2 --ckpt "$f" > "$W/out" 2>&1 || { fail "fit --ckpt $f:"; cat "$W/out"; }
  "$KILN" -q test "$W/run.cfg" --ckpt "$f" > "$W/out" 2>&1 || { fail "test --ckpt $f:"; cat "$W/out"; }
done
[ $fails -eq 0 ] && echo "ckpt_checksum: all checks passed"
exit $fails
