"""gptref.py — what the kiln-vs-PyTorch checks share: reading and writing
the files kiln reads and writes (safetensors with numpy, llm.c token shards),
running `kiln fit` on a generated run file, and GPT-2 written out in plain
PyTorch ops from a dict of tensors under Hugging Face's GPT2LMHeadModel names
(the names, shapes and Conv1D layouts the `gpt` module registers), so the
reference shares no code with the model it checks.
"""
import json
import math
import os
import struct
import subprocess
import sys

import numpy as np

DT = {"F32": np.float32, "F64": np.float64, "U8": np.uint8, "I32": np.int32}



def start(argv, doc, torch):
    """(kiln, workdir) of a check run as `SCRIPT KILN WORKDIR` (else its
    usage, `doc`, and exit), with workdir made and torch on one thread, as
    both checks run."""
    if len(argv) != 3:
        raise SystemExit(doc)
    kiln, work = argv[1], argv[2]
    os.makedirs(work, exist_ok=True)
    torch.set_num_threads(1)
    return kiln, work


def finish(ok):
    """A check's last line, PASS or FAIL, and its exit status."""
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)

def read_safetensors(path):
    """(tensors, metadata): every tensor as a numpy array, __metadata__."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, v in header.items():
        a, b = v["data_offsets"]
        out[name] = np.frombuffer(data[a:b], DT[v["dtype"]]).reshape(v["shape"]).copy()
    return out, meta


def write_shard(path, tokens):
    """An llm.c token shard: 256 int32 header (magic, version, count), uint16 tokens."""
    header = np.zeros(256, np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, np.uint16).tobytes())


def windows(tokens, T, first, count):
    """Rows first..first+count-1 of the sequential windows (T+1 tokens, a new
    one every T tokens): (inputs, targets), each (count, T) int64."""
    x = np.stack([tokens[k * T:k * T + T] for k in range(first, first + count)])
    y = np.stack([tokens[k * T + 1:k * T + T + 1] for k in range(first, first + count)])
    return x.astype(np.int64), y.astype(np.int64)


def run_file(root, shard, cfg, precision, max_steps, callbacks, lr=1e-2, weight_decay=0.1):
    """A kiln run file for the tiny GPT on one shard, sequential batches."""
    return f"""
trainer = {{ max_steps = {max_steps}; seed = 7; default_root_dir = "{root}"; log_every_n_steps = 1;
            num_sanity_val_steps = 0; threads = 1; }};
accelerator = "cpu";
precision = "{precision}";
data = {{ name = "tokens"; train = "{shard}"; batch_size = {cfg['B']}; block_size = {cfg['T']};
         vocab_size = {cfg['V']}; shuffle = false; }};
module = {{ name = "gpt"; n_layer = {cfg['L']}; n_head = {cfg['NH']}; n_embd = {cfg['C']};
           block_size = {cfg['T']}; vocab_size = {cfg['V']}; padded_vocab_size = {cfg['Vp']};
           max_batch = {cfg['B']}; }};
optimizer = {{ name = "adamw"; lr = {lr}; beta1 = 0.9; beta2 = 0.95; eps = 1e-8; weight_decay = {weight_decay}; }};
callbacks = ( {callbacks} );
"""


def run_kiln(kiln, cfg_text, workdir, name, extra=(), env_extra=None):
    path = os.path.join(workdir, name + ".cfg")
    with open(path, "w") as f:
        f.write(cfg_text)
    env = dict(os.environ)
    if env_extra:
        env.update(env_extra)
    p = subprocess.run([kiln, "-q", "fit", path, *extra], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"kiln fit {path} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p.stdout + p.stderr


def torch_gpt_loss(torch, P, x, y, cfg, attn_scale=None):
    """GPT-2 forward and mean cross-entropy in plain ops. P: name -> tensor
    (requires_grad as the caller wants); x, y: (B, T) int64 tensors."""
    F = torch.nn.functional
    L, NH, C, V = cfg["L"], cfg["NH"], cfg["C"], cfg["V"]
    B, T = x.shape
    D = C // NH
    scale = 1.0 / math.sqrt(D) if attn_scale is None else attn_scale
    pos = torch.arange(T)
    h = P["transformer.wte.weight"][x] + P["transformer.wpe.weight"][pos]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(L):
        pre = f"transformer.h.{i}."
        a = F.layer_norm(h, (C,), P[pre + "ln_1.weight"], P[pre + "ln_1.bias"], 1e-5)
        qkv = a @ P[pre + "attn.c_attn.weight"] + P[pre + "attn.c_attn.bias"]  # Conv1D: x W + b
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, NH, D).transpose(1, 2)
        k = k.view(B, T, NH, D).transpose(1, 2)
        v = v.view(B, T, NH, D).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * scale
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        o = (att @ v).transpose(1, 2).reshape(B, T, C)
        h = h + o @ P[pre + "attn.c_proj.weight"] + P[pre + "attn.c_proj.bias"]
        m = F.layer_norm(h, (C,), P[pre + "ln_2.weight"], P[pre + "ln_2.bias"], 1e-5)
        m = F.gelu(m @ P[pre + "mlp.c_fc.weight"] + P[pre + "mlp.c_fc.bias"], approximate="tanh")
        h = h + m @ P[pre + "mlp.c_proj.weight"] + P[pre + "mlp.c_proj.bias"]
    h = F.layer_norm(h, (C,), P["transformer.ln_f.weight"], P["transformer.ln_f.bias"], 1e-5)
    logits = h @ P["transformer.wte.weight"].t()  # tied output layer, (B, T, V)
    return F.cross_entropy(logits.reshape(-1, V), y.reshape(-1), ignore_index=-1), logits
