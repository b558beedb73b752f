#!/usr/bin/python3
"""torch_gpt.py — the PyTorch side of bench/gpt_cpu/run.sh: the same GPT as
kiln's `gpt` module (4 layers, 4 heads, C wide, T = 128, byte vocabulary;
written in plain eager ops, tests/gpt_torch/gptref.py) trained with AdamW on
random byte windows, on THREADS intra-op threads. Prints one line
RESULT {"tokens_per_s": ..., "peak_rss_mib": ..., "step_ms": ...}: the median
step after WARMUP steps, and the process's peak RSS.

Usage: torch_gpt.py THREADS C B STEPS WARMUP
"""
import json
import os
import resource
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "gpt_torch"))
import gptref  # noqa: E402


def main():
    threads, C, B, steps, warmup = (int(a) for a in sys.argv[1:6])
    torch.set_num_threads(threads)
    T, V, L = 128, 256, 4
    cfg = {"L": L, "NH": 4, "C": C, "T": T, "V": V}
    g = torch.Generator().manual_seed(0)
    P = {"transformer.wte.weight": torch.randn(V, C, generator=g) * 0.02,
         "transformer.wpe.weight": torch.randn(T, C, generator=g) * 0.02}
    for i in range(L):
        p = f"transformer.h.{i}."
        for n, shape in (("attn.c_attn", (C, 3 * C)), ("attn.c_proj", (C, C)), ("mlp.c_fc", (C, 4 * C)),
                         ("mlp.c_proj", (4 * C, C))):
            P[p + n + ".weight"] = torch.randn(*shape, generator=g) * 0.02
            P[p + n + ".bias"] = torch.zeros(shape[1])
        for n in ("ln_1", "ln_2"):
            P[p + n + ".weight"] = torch.ones(C)
            P[p + n + ".bias"] = torch.zeros(C)
    P["transformer.ln_f.weight"], P["transformer.ln_f.bias"] = torch.ones(C), torch.zeros(C)
    for t in P.values():
        t.requires_grad_(True)
    decay = [t for t in P.values() if t.dim() >= 2]
    no_decay = [t for t in P.values() if t.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=2e-3, betas=(0.9, 0.95))
    rng = np.random.default_rng(0)
    times = []
    for s in range(steps):
        xy = torch.from_numpy(rng.integers(0, V, (B, T + 1)))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss, _ = gptref.torch_gpt_loss(torch, P, xy[:, :T], xy[:, 1:], cfg)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    step = float(np.median(times[warmup:]))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print("RESULT " + json.dumps({"tokens_per_s": B * T / step, "peak_rss_mib": rss, "step_ms": step * 1e3}))


if __name__ == "__main__":
    main()
