#!/usr/bin/env python3
"""bench/gpu/torch_gpt2.py -- the peer of kiln's GPT-2 124M benchmark: the same
model (12 layers, 12 heads, 768 wide, context 1024, vocabulary 50257 padded
to 50304, tied embeddings, GELU with the tanh approximation), the same step
(bf16 autocast, AdamW with betas (0.9, 0.95) and weight decay 0.1, gradient
clipping at 1.0) and batch, in PyTorch on the same GPU: eager with its fused
attention (F.scaled_dot_product_attention, causal), then torch.compile.
Prints one JSON line per mode: tokens/s (median of the timed steps), the
step time and the peak memory.

    python3 bench/gpu/torch_gpt2.py --batch 16 [--steps 20] [--no-compile]

Written from the model's definition (GPT-2's, as nanoGPT and llm.c build
it); nothing here is kiln's. Needs torch with CUDA; exits 77 without it.
"""
import argparse
import json
import math
import statistics
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    print(json.dumps({"error": "no torch"}))
    sys.exit(77)


class Block(nn.Module):
    def __init__(self, C, nh):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)
        self.nh = nh

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L=12, nh=12, C=768, T=1024, Vp=50304):
        super().__init__()
        self.wte = nn.Embedding(Vp, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, nh) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, Vp, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as GPT-2
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def run(model, B, T, steps, warmup):
    dev = "cuda"
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randint(0, 50257, (B, T), generator=g).to(dev)
    y = torch.randint(0, 50257, (B, T), generator=g).to(dev)
    times = []
    torch.cuda.reset_peak_memory_stats()
    for i in range(warmup + steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    step = statistics.median(times)
    return {"step_ms": round(step * 1e3, 3), "tokens_per_s": round(B * T / step),
            "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2), "loss": float(loss)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"error": "torch has no CUDA device"}))
        sys.exit(77)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    modes = ["eager"] + ([] if a.no_compile else ["compile"])
    for mode in modes:
        torch.manual_seed(0)
        model = GPT(T=a.seq).cuda()
        m = torch.compile(model) if mode == "compile" else model
        try:
            r = run(m, a.batch, a.seq, a.steps, a.warmup + (5 if mode == "compile" else 0))
        except Exception as e:  # a compile failure is a result too
            r = {"error": f"{type(e).__name__}: {e}"[:300]}
        r.update({"check": "torch_gpt2_" + mode, "batch": a.batch, "seq": a.seq, "torch": torch.__version__,
                  "device": torch.cuda.get_device_name(0)})
        print(json.dumps(r), flush=True)
        del model, m
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
