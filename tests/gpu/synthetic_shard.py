#!/usr/bin/env python3
"""tests/gpu/synthetic_shard.py PATH N -- an llm.c token shard (docs/data-tokens.md:
a header of 256 little-endian int32, magic 20240520, version 1, N, then N
uint16 tokens) of GPT-2 token ids for the GPU checks and benchmark: a fixed
random "text" of 8192 ids repeated, with 5 % of the tokens replaced at
random, so that a model has something to learn and the loss falls. The same
bytes for the same N on every machine (seeded)."""
import array
import random
import sys

path, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(124)
base = [rng.randrange(50257) for _ in range(8192)]
toks = array.array("H", (base[i % len(base)] if rng.random() > 0.05 else rng.randrange(50257) for i in range(n)))
if sys.byteorder != "little":
    toks.byteswap()
hdr = array.array("i", [20240520, 1, n] + [0] * 253)
if sys.byteorder != "little":
    hdr.byteswap()
with open(path, "wb") as f:
    hdr.tofile(f)
    toks.tofile(f)
