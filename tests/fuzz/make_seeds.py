#!/usr/bin/env python3
"""tests/fuzz/make_seeds.py - (re)make the seed corpora of the fuzz targets
from real kiln output, so the fuzzers start from inputs kiln itself writes
and reads rather than from nothing. Run it from any directory with a built
tree (normally build-fz) and the Fashion-MNIST files installed:

    python3 tests/fuzz/make_seeds.py BUILD_DIR

It trains a few tiny runs with BUILD_DIR/bin/kiln (Fashion-MNIST with an
MLP of 2 hidden units; adamw, sgd, lbfgs, 16-mixed; the checkpoint,
early_stopping and plateau plugins; a byte-level GPT on a few KiB of text
for the tokens plugin), then writes
  safetensors/seeds  the checkpoints those runs wrote, plus a few cut ones
  state/seeds        every "__state__.<role>" blob of those checkpoints,
                     framed as fuzz_state reads it (plugin, flags, version)
  config/seeds       the example run files and the runs' effective configs,
                     with --set assignments after NUL bytes
  idx_raw/seeds, idx_gzip/seeds   heads of the real IDX files (count cut
                     to a few items so the header tells the truth)
  tokens/seeds       a shard written by kiln-text2tokens and raw text
  ckpt_meta/seeds    the checkpoints' "progress", "loops", "metrics" and
                     "state.optimizer" JSON texts, NUL-separated
  ddp_hello/seeds    rendezvous hellos as plugins/ddp builds them (with and
                     without a secret), written by fuzz_replay_ddp_hello
The seeds are committed; rerun this only when a format changes. Hand-made
hostile inputs live in <target>/regressions and are not touched here.
"""
import gzip, json, os, shutil, struct, subprocess, sys, tempfile

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))
build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "build-fz"))
kiln = os.path.join(build, "bin", "kiln")
t2t = os.path.join(build, "bin", "kiln-text2tokens")
fm = "/usr/share/datasets/fashion-mnist"
# the plugin order of fuzz_state.c's table: byte 0 of a state input
state_index = {"adamw": 0, "sgd": 1, "lbfgs": 2, "16-mixed": 3, "gan": 4, "plateau": 5,
               "early_stopping": 6, "checkpoint": 7, "idx": 8, "tokens": 9}
tmp = tempfile.mkdtemp(prefix="kiln-seeds-")


def seeds(target):
    d = os.path.join(here, target, "seeds")
    os.makedirs(d, exist_ok=True)
    return d


def put(target, name, data):
    with open(os.path.join(seeds(target), name), "wb") as f:
        f.write(data)


def run(name, sets, cfg=os.path.join(root, "examples", "fashion_mnist.cfg")):
    out = os.path.join(tmp, name)
    cmd = [kiln, "-q", "fit", cfg, "--set", f'trainer.default_root_dir="{out}"',
           "--set", "trainer.num_sanity_val_steps=0"]
    for s in sets:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return os.path.join(out, "version_0")


def read_ckpt(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    return b, header, b[8 + n:]


small_mlp = ['module.layers=[784,2,10]', 'trainer.max_epochs=2', 'trainer.limit_train_batches=3',
             'trainer.limit_val_batches=2']
runs = {
    "adamw_plateau_callbacks": small_mlp + [
        'callbacks=({name="checkpoint"; monitor="val_loss"; save_top_k=2;},'
        '{name="early_stopping"; monitor="val_loss";})',
        'scheduler={name="plateau"; monitor="val_loss"; interval="epoch";}'],
    "sgd_16mixed": small_mlp + ['optimizer={name="sgd"; lr=0.1; momentum=0.9;}', 'precision="16-mixed"'],
    "lbfgs": small_mlp + ['optimizer={name="lbfgs"; lr=0.5; history_size=3; max_iter=2;}'],
}
ckpts = []
for name, sets in runs.items():
    v = run(name, sets)
    ckpts.append((name, os.path.join(v, "checkpoints", "last.safetensors")))
    shutil.copy(os.path.join(v, "config.cfg"), os.path.join(tmp, name + ".cfg"))

# the tokens plugin: a byte-level GPT of one layer on a little text
text = os.path.join(tmp, "text.txt")
with open(text, "w") as f:
    f.write(("kiln trains models from plugins; a checkpoint carries their state. " * 40))
gv = run("gpt_tokens", ['trainer.max_epochs=1', 'trainer.limit_train_batches=2', 'trainer.limit_val_batches=1',
                        'trainer.val_check_interval=2', f'data.train="{text}"', 'data.exclude=""',
                        'data.batch_size=2', 'data.block_size=8', 'module.n_layer=1', 'module.n_head=1',
                        'module.n_embd=8', 'module.block_size=8', 'module.max_batch=2',
                        'callbacks=({name="progress";})'],
         cfg=os.path.join(root, "examples", "gpt_fortunes.cfg"))
ckpts.append(("gpt_tokens", os.path.join(gv, "checkpoints", "last.safetensors")))

for name, path in ckpts:
    b, header, data = read_ckpt(path)
    if len(b) < 64 << 10:
        put("safetensors", f"{name}.safetensors", b)
    # header only (the tensors cut off): refused as truncated
    n = struct.unpack("<Q", b[:8])[0]
    put("safetensors", f"{name}.header-only", b[:8 + n])
    meta = header.get("__metadata__", {})
    put("ckpt_meta", name, b"\0".join(meta[k].encode() for k in ("progress", "loops", "metrics", "state.optimizer")))
    for key, tensor in header.items():
        if not key.startswith("__state__."):
            continue
        role = key[len("__state__."):]
        entry = json.loads(meta["state." + role])
        plugin, version = entry["plugin"], entry["version"]
        if plugin not in state_index:
            continue
        a, e = tensor["data_offsets"]
        blob = data[a:e]
        for flags in (0x00, 0x80):  # data plugins: set up after / before set_state
            frame = bytes([state_index[plugin], flags]) + struct.pack("<I", int(version)) + blob
            put("state", f"{name}-{role}-{plugin}-{flags:02x}", frame)

# a minimal valid file, and one with metadata only
hdr = b'{"__metadata__":{"format":"kiln-checkpoint-1"}}'
hdr += b" " * (-len(hdr) % 8)
put("safetensors", "metadata-only", struct.pack("<Q", len(hdr)) + hdr)
hdr = b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[],"data_offsets":[8,9]}}'
hdr += b" " * (-len(hdr) % 8)
put("safetensors", "two-tensors", struct.pack("<Q", len(hdr)) + hdr + bytes(9))

# run files: the examples without @include, and the runs' effective configs
for cfg in sorted(os.listdir(os.path.join(root, "examples"))):
    p = os.path.join(root, "examples", cfg)
    if cfg.endswith(".cfg") and b"@include" not in open(p, "rb").read():
        t = open(p, "rb").read()
        put("config", cfg, t)
        put("config", cfg + "+sets", t + b"\0trainer.max_epochs=3\0optimizer.lr=0.5\0callbacks.[0].name=\"x\""
            b"\0precision.init_scale=1024.0\0trainer.max_steps=5000000000L\0module.layers.[1]=7")
for name in runs:
    put("config", name + ".effective.cfg", open(os.path.join(tmp, name + ".cfg"), "rb").read())

# IDX heads: the real headers and first items, the count cut to match
imgs = gzip.open(os.path.join(fm, "t10k-images-idx3-ubyte.gz")).read(16 + 3 * 784)
labs = gzip.open(os.path.join(fm, "t10k-labels-idx1-ubyte.gz")).read(8 + 16)
img3 = imgs[:4] + struct.pack(">I", 3) + imgs[8:16] + imgs[16:]
lab16 = labs[:4] + struct.pack(">I", 16) + labs[8:]
put("idx_raw", "t10k-images-head3", img3)
put("idx_raw", "t10k-labels-head16", lab16)
put("idx_raw", "t10k-images-header-only", imgs[:16])
put("idx_raw", "t10k-labels.gz-head", open(os.path.join(fm, "t10k-labels-idx1-ubyte.gz"), "rb").read()[:256])
put("idx_raw", "images-head3.gz", gzip.compress(img3))
put("idx_raw", "labels-head16.gz", gzip.compress(lab16))
for ctl, tag in ((0x61, "intact"), (0x63, "cut"), (0x65, "flip"), (0x67, "no-trailer"), (0x69, "garbage"),
                 (0x6b, "two-members"), (0x6d, "twice")):
    put("idx_gzip", f"images-{tag}", bytes([ctl, 0x40, 0x02]) + img3)
    put("idx_gzip", f"labels-{tag}", bytes([ctl & 0xfe, 0x10, 0x00]) + lab16)

# token shards: kiln-text2tokens output and raw text, with the target's control bytes
shard = os.path.join(tmp, "shard.bin")
with open(os.path.join(tmp, "small.txt"), "w") as f:
    f.write("to be or not to be, that is the question.\n")
subprocess.run([t2t, "-o", shard, os.path.join(tmp, "small.txt")], check=True)
sb = open(shard, "rb").read()
#           ctl   T-1  vocab(LE)  lo   hi   B-1 rank W-1 first
ctl_llmc = bytes([0x08, 3, 0x00, 0x01, 0, 255, 1, 0, 0, 0])
put("tokens", "llmc-one-shard", ctl_llmc + sb)
two = bytes([0x0a, 3, 0x00, 0x01, 10, 250, 2, 1, 1, 1]) + struct.pack("<H", len(sb)) + sb + sb
put("tokens", "llmc-two-shards", two)
put("tokens", "text-one-file", bytes([0x19, 4, 0, 0, 0, 255, 3, 0, 0, 0]) + b"the quick brown fox jumps over it")
put("tokens", "text-three-files", bytes([0x05, 2, 0, 0, 0, 200, 0, 0, 2, 2]) + b"\x05\x00hello\x03\x00abc" +
    b"and the rest")

# hellos: the target writes them with the plugin's own ddp_tcp_build_hello
replay = os.path.join(build, "tests", "fuzz", "fuzz_replay_ddp_hello")
if os.path.exists(replay):
    subprocess.run([replay], check=True, stdout=subprocess.DEVNULL,
                   env=dict(os.environ, KILN_FUZZ_DDP_SEEDS=seeds("ddp_hello")))
# state blobs as the harness's own instances write them
subprocess.run([os.path.join(build, "tests", "fuzz", "fuzz_replay_state")], check=True, stdout=subprocess.DEVNULL,
               env=dict(os.environ, KILN_FUZZ_STATE_SEEDS=seeds("state")))

shutil.rmtree(tmp)
print("seeds written under", here)
