"""The default `loom train` recipe in PyTorch, for comparing validation losses across
seeds: nanoGPT's shakespeare_char CPU configuration (4 layers, 4 heads, width 128,
context 64, batch 12, 2000 steps, AdamW 1e-3 with 100 warmup steps and cosine decay to
1e-4, betas (0.9, 0.99), weight decay 0.1 on matrices, clipping 1.0), on the GPT-2 model
of tools/torch_gpt.py (biases, tanh GELU) or without biases (--no-bias, nanoGPT's model).
Prints one JSON line with the validation loss over all consecutive non-overlapping
windows of the validation split (the number `loom train` reports as val_loss).

  /usr/bin/python3 tools/torch_train_shakespeare.py --seed 1 [--no-bias] [--steps 2000]"""
import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from torch_gpt import GPT, window_loss  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--no-bias", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    text = open(os.path.join(ROOT, "data", "tinyshakespeare", "input.txt"), encoding="utf-8").read()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    n = int(len(data) * 0.9)
    train, val = data[:n], data[n:]
    V, T, B, L, H, C = len(chars), 64, 12, 4, 4, 128
    model = GPT(V, T, L, H, C)
    with torch.no_grad():  # nanoGPT / GPT-2 init
        for name, prm in model.named().items():
            if name.endswith("c_proj.weight"):
                prm.normal_(0.0, 0.02 / math.sqrt(2 * L))
            elif name.endswith(".weight") and prm.dim() == 2:
                prm.normal_(0.0, 0.02)
    named = model.named()
    trainable = {k: v for k, v in named.items() if not (a.no_bias and k.endswith(".bias"))}
    if a.no_bias:
        for k, v in named.items():
            if k.endswith(".bias"):
                v.requires_grad_(False)
    decay = [v for v in trainable.values() if v.dim() >= 2]
    no_decay = [v for v in trainable.values() if v.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.99), eps=1e-8)

    def lr_at(it, warmup=100, decay_steps=a.steps, max_lr=1e-3, min_lr=1e-4):
        if it < warmup:
            return max_lr * (it + 1) / (warmup + 1)
        if it > decay_steps:
            return min_lr
        ratio = (it - warmup) / (decay_steps - warmup)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (max_lr - min_lr)

    start = time.time()
    for it in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(it)
        ix = torch.randint(len(train) - T, (B,))
        x = torch.stack([train[i:i + T] for i in ix])
        y = torch.stack([train[i + 1:i + 1 + T] for i in ix])
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(trainable.values()), 1.0)
        opt.step()
    val_loss, _ = window_loss(model, val, T)
    print(json.dumps({"seed": a.seed, "bias": not a.no_bias, "steps": a.steps, "val_loss": val_loss,
                      "seconds": round(time.time() - start, 1), "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
