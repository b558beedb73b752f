#!/usr/bin/env python3
"""check_gpt_hf.py — the `gpt` module's parameters are Hugging Face's:

1. kiln -> transformers: `kiln fit` trains a tiny GPT a few steps and writes
   its checkpoint; the weights load into `transformers`' GPT2LMHeadModel by
   name and shape with no missing parameter (the tied lm_head.weight and
   the attention-mask buffers aside) and no unexpected one, and the model's
   logits on a token sequence equal the logits kiln's own predict_step gives
   for the same tokens (the `logitdump` fixture reads them through
   svc->predict at the end of the fit).
2. transformers -> kiln: a GPT2Model's weights saved as Hugging Face
   publishes GPT-2 (model.safetensors, names without "transformer.") start a
   kiln run with `fit --ckpt FILE --weights-only`, and kiln's logits equal
   the transformers model's.

Run with a Python that has `transformers` (4.40, the last line that runs on
Debian's torch 1.13) and `safetensors`: .ci/setup.sh test makes that virtual
environment. Usage: check_gpt_hf.py KILN WORKDIR; KILN_PLUGIN_PATH must reach
the logitdump fixture. Exit 0 on agreement, 1 otherwise, 77 (skip) without
transformers.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gptref  # noqa: E402

try:
    import torch
    from safetensors.torch import save_file
    from transformers import GPT2Config, GPT2LMHeadModel
except ImportError as e:
    print(f"SKIP: {e}")
    sys.exit(77)

CFG = {"L": 2, "NH": 2, "C": 16, "T": 8, "V": 37, "Vp": 64, "B": 4}
SEQ = [3, 10, 31, 20, 24, 36, 0, 1]  # any T tokens
TOL = 2e-5  # max |kiln - transformers| over the logits, float32


def hf_model():
    cfg = GPT2Config(vocab_size=CFG["V"], n_positions=CFG["T"], n_embd=CFG["C"], n_layer=CFG["L"],
                     n_head=CFG["NH"], activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0, layer_norm_epsilon=1e-5)
    return GPT2LMHeadModel(cfg).eval()


def hf_logits(model):
    with torch.no_grad():
        return model(torch.tensor([SEQ])).logits[0].numpy()


def kiln_run(kiln, work, name, shard, steps, extra=()):
    logits = os.path.join(work, f"logits-{name}.safetensors")
    cb = f'{{ name = "logitdump"; path = "{logits}"; tokens = [{", ".join(map(str, SEQ))}]; }}'
    root = os.path.join(work, f"runs-{name}")
    gptref.run_kiln(kiln, gptref.run_file(root, shard, CFG, "32-true", steps, cb), work, name, extra)
    t, _ = gptref.read_safetensors(logits)
    return t["logits"], root


def main():
    kiln, work = gptref.start(sys.argv, __doc__, torch)
    rng = np.random.default_rng(7)
    shard = os.path.join(work, "tokens.bin")
    gptref.write_shard(shard, rng.integers(0, CFG["V"], 12 * CFG["B"] * CFG["T"] + 1))
    ok = True

    # 1. kiln's checkpoint into transformers
    klog, root = kiln_run(kiln, work, "train", shard, 5)
    ckpt = os.path.join(root, "version_0", "checkpoints", "last.safetensors")
    tensors, meta = gptref.read_safetensors(ckpt)
    sd = {k: torch.from_numpy(v) for k, v in tensors.items() if not k.startswith("__state__.")}
    model = hf_model()
    res = model.load_state_dict(sd, strict=False)
    buffers = {n for n, _ in model.named_buffers()}
    missing = [k for k in res.missing_keys if k != "lm_head.weight" and k not in buffers]
    print(f"kiln -> transformers: {len(sd)} tensors loaded; missing {res.missing_keys}, unexpected "
          f"{res.unexpected_keys}")
    if missing or res.unexpected_keys:
        print(f"FAIL: missing {missing}, unexpected {res.unexpected_keys}")
        ok = False
    model.tie_weights()
    hl = hf_logits(model)
    err = float(np.max(np.abs(hl - klog)))
    print(f"logits of {len(SEQ)} positions x {CFG['V']}: max |kiln - transformers| = {err:.2e} (tolerance {TOL:g})")
    ok &= klog.shape == hl.shape and err <= TOL

    # 2. a Hugging Face GPT-2 file (GPT2Model names, no "transformer.") into kiln
    torch.manual_seed(0)
    fresh = hf_model()
    inner = {k: v.contiguous() for k, v in fresh.transformer.state_dict().items()}
    hf_file = os.path.join(work, "model.safetensors")
    save_file(inner, hf_file, metadata={"format": "pt"})
    klog2, _ = kiln_run(kiln, work, "from-hf", shard, 0, ("--ckpt", hf_file, "--weights-only"))
    err2 = float(np.max(np.abs(hf_logits(fresh) - klog2)))
    print(f"transformers -> kiln (--weights-only from {len(inner)} GPT2Model tensors): max |kiln - transformers| = "
          f"{err2:.2e}")
    ok &= err2 <= TOL
    gptref.finish(ok)


if __name__ == "__main__":
    main()
