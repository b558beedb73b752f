#!/usr/bin/python3
"""check_gpt_torch.py — kiln's `gpt` module against the same GPT written in
PyTorch (Debian's python3-torch), on a tiny model and random tokens:

1. `kiln fit` trains 10 AdamW steps; the test-only `graddump` callback
   records the weights and gradients of the first step and every step's
   loss.
2. PyTorch rebuilds the model from those weights (gptref.py, plain ops under
   Hugging Face's names and layouts), computes the loss and the gradients on
   the same first batch, then takes the same 10 AdamW steps (weight decay on
   matrices and embeddings only, as the module registers them).
3. Tolerances: in 32-true the first loss within 1e-5 relative, every
   parameter's gradient within 1e-4 (max-norm relative: max|g_kiln - g_torch|
   / max|g_torch|), the 10 losses within 1e-4; in 64-true 1e-10 for loss and
   gradients, 1e-9 for the losses of the trajectory.
4. The check must be able to fail: the same comparison against a reference
   whose attention scale is 1/D instead of 1/sqrt(D), and against gradients
   with one tensor scaled by 1.001, must report a mismatch.

Usage: check_gpt_torch.py KILN WORKDIR (the plugin directories come from the
environment: KILN_PLUGIN_PATH must reach the graddump fixture). Exit 0 when
everything agrees, 1 otherwise, 77 when torch is missing (CTest skip).
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gptref  # noqa: E402

try:
    import torch
except ImportError:
    print("SKIP: python3-torch is not installed")
    sys.exit(77)

CFG = {"L": 2, "NH": 2, "C": 16, "T": 8, "V": 37, "Vp": 64, "B": 4}
STEPS = 10
LR, BETAS, EPS, WD = 1e-2, (0.9, 0.95), 1e-8, 0.1


def compare_grads(P, grads, kiln_grads, tol):
    """Names of the tensors whose gradients disagree, with the worst error."""
    bad, worst = [], 0.0
    for name, g in grads.items():
        k = kiln_grads[name]
        denom = float(np.max(np.abs(g))) or 1.0
        err = float(np.max(np.abs(k - g))) / denom
        worst = max(worst, err)
        if not err <= tol:
            bad.append((name, err))
    return bad, worst


def torch_grads(params, x, y, dtype, attn_scale=None):
    P = {n: torch.tensor(v, dtype=dtype, requires_grad=True) for n, v in params.items()}
    loss, _ = gptref.torch_gpt_loss(torch, P, torch.tensor(x), torch.tensor(y), CFG, attn_scale)
    loss.backward()
    return float(loss), {n: p.grad.numpy() for n, p in P.items()}


def torch_trajectory(params, tokens, dtype):
    """Losses of STEPS AdamW steps over the sequential batches."""
    P = {n: torch.tensor(v, dtype=dtype, requires_grad=True) for n, v in params.items()}
    decay = [p for n, p in P.items() if p.dim() >= 2]  # matrices and embeddings
    no_decay = [p for n, p in P.items() if p.dim() < 2]  # biases, LayerNorm
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    losses = []
    for s in range(STEPS):
        x, y = gptref.windows(tokens, CFG["T"], s * CFG["B"], CFG["B"])
        opt.zero_grad()
        loss, _ = gptref.torch_gpt_loss(torch, P, torch.tensor(x), torch.tensor(y), CFG)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


def check(kiln, work, precision):
    f64 = precision == "64-true"
    dtype = torch.float64 if f64 else torch.float32
    tol_loss, tol_grad, tol_traj = (1e-10, 1e-10, 1e-9) if f64 else (1e-5, 1e-4, 1e-4)
    rng = np.random.default_rng(20240520)
    n = 12 * CFG["B"] * CFG["T"] + 1
    # a learnable stream: mostly next = 3 * prev + 1 (mod V), 10 % noise
    tokens = np.zeros(n, np.int64)
    noise = rng.integers(0, CFG["V"], n)
    for i in range(1, n):
        tokens[i] = noise[i] if rng.random() < 0.1 else (3 * tokens[i - 1] + 1) % CFG["V"]
    shard = os.path.join(work, "tokens.bin")
    gptref.write_shard(shard, tokens)
    dump = os.path.join(work, f"dump-{precision}.safetensors")
    cb = f'{{ name = "graddump"; path = "{dump}"; }}'
    gptref.run_kiln(kiln, gptref.run_file(os.path.join(work, "runs"), shard, CFG, precision, STEPS, cb, LR, WD), work,
                    f"gpt-{precision}")
    t, meta = gptref.read_safetensors(dump)
    kiln_losses = [float(v) for v in meta["losses"].split(",")]
    params = {k[6:]: v for k, v in t.items() if k.startswith("param.")}
    kgrads = {k[5:]: v for k, v in t.items() if k.startswith("grad.")}
    ok = True
    print(f"== {precision}: {len(params)} parameter tensors, "
          f"{sum(v.size for v in params.values())} values, kiln losses {len(kiln_losses)}")
    if len(kiln_losses) != STEPS:
        print(f"FAIL: kiln recorded {len(kiln_losses)} losses, expected {STEPS}")
        return False

    x, y = gptref.windows(tokens, CFG["T"], 0, CFG["B"])
    tloss, tgrads = torch_grads(params, x, y, dtype)
    rel = abs(kiln_losses[0] - tloss) / abs(tloss)
    print(f"first loss: kiln {kiln_losses[0]:.12g} torch {tloss:.12g} (relative {rel:.2e}, tolerance {tol_loss:g})")
    ok &= rel <= tol_loss
    bad, worst = compare_grads(params, tgrads, kgrads, tol_grad)
    print(f"gradients: worst max-norm relative error {worst:.2e} over {len(tgrads)} tensors (tolerance {tol_grad:g})")
    for name, err in bad:
        print(f"FAIL: gradient of {name}: {err:.3e}")
    ok &= not bad

    traj = torch_trajectory(params, tokens, dtype)
    diffs = [abs(a - b) / max(1.0, abs(b)) for a, b in zip(kiln_losses, traj)]
    print(f"{STEPS} AdamW steps: worst loss difference {max(diffs):.2e} (tolerance {tol_traj:g}); "
          f"kiln {kiln_losses[0]:.6f} -> {kiln_losses[-1]:.6f}, torch {traj[0]:.6f} -> {traj[-1]:.6f}")
    ok &= max(diffs) <= tol_traj
    ok &= traj[-1] < traj[0]  # it trained

    # the comparison has teeth: a wrong attention scale, a gradient off by 0.1 %
    _, mgrads = torch_grads(params, x, y, dtype, attn_scale=1.0 / (CFG["C"] // CFG["NH"]))
    mbad, _ = compare_grads(params, mgrads, kgrads, tol_grad)
    print(f"mutant reference (attention scale 1/D): {len(mbad)} tensors disagree"
          f"{' (detected)' if mbad else ' -- NOT DETECTED'}")
    ok &= bool(mbad)
    scaled = dict(kgrads)
    scaled["transformer.h.1.attn.c_attn.weight"] = kgrads["transformer.h.1.attn.c_attn.weight"] * 1.001
    sbad, _ = compare_grads(params, tgrads, scaled, tol_grad)
    print(f"mutant gradient (c_attn of block 1 x 1.001): {'detected' if sbad else 'NOT DETECTED'}")
    ok &= bool(sbad)
    return ok


def main():
    kiln, work = gptref.start(sys.argv, __doc__, torch)
    ok = True
    for precision in ("32-true", "64-true"):
        ok &= check(kiln, work, precision)
    gptref.finish(ok)


if __name__ == "__main__":
    main()
