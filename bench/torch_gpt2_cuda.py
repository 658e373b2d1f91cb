#!/usr/bin/env python3
"""PyTorch eager on a GPU: GPT-2 124M training steps, the mark `scripts/gpu-check` sets
Loom's CUDA backend against.

The model is GPT-2 as Hugging Face defines it (pre-LN, LayerNorm eps 1e-5, tanh GELU,
tied LM head, biases), the strongest eager setup PyTorch offers without compiling:
bf16 autocast, F.scaled_dot_product_attention (flash attention), fused AdamW. Tokens are
uniform random over the vocabulary (the same data Loom's `--data random` uses); timing
uses CUDA events around whole steps after warm-up.

Prints one JSON line: step_ms_median, tokens_per_s, mfu, loss_first, loss_last, params.
MFU counts 6 N + 12 L T C FLOPs per token (PaLM's formula, as nanoGPT) against --peak.

Usage: bench/torch_gpt2_cuda.py [--batch 16] [--context 1024] [--steps 30] [--warmup 5]
                                [--precision bf16|f32] [--peak 989e12]
"""
import argparse
import json
import math
import statistics

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width, eps=1e-5)
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width, eps=1e-5)
        self.c_fc = nn.Linear(width, 4 * width)
        self.mlp_proj = nn.Linear(4 * width, width)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, context, layers, heads, width):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width, eps=1e-5)
        for name, p in self.named_parameters():
            if p.dim() == 2:  # GPT-2's init; residual projections scaled by 1/sqrt(2 L)
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied LM head
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--precision", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--peak", type=float, default=989e12, help="dense bf16 FLOP/s of the GPU (H100/H200 SXM)")
    ap.add_argument("--seed", type=int, default=1337)
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    dev = torch.device("cuda")
    model = GPT(a.vocab, a.context, a.layers, a.heads, a.width).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    params = sum(p.numel() for p in model.parameters())
    gen = torch.Generator(device=dev).manual_seed(a.seed)
    losses, times = [], []
    for step in range(a.warmup + a.steps):
        idx = torch.randint(a.vocab, (a.batch, a.context), device=dev, generator=gen)
        targets = torch.randint(a.vocab, (a.batch, a.context), device=dev, generator=gen)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = model(idx, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        end.record()
        end.synchronize()
        losses.append(loss.item())
        if step >= a.warmup:
            times.append(start.elapsed_time(end) / 1000.0)
    step_s = statistics.median(times)
    tokens_per_s = a.batch * a.context / step_s
    flops_per_token = 6 * params + 12 * a.layers * a.width * a.context
    print(json.dumps({
        "framework": f"pytorch {torch.__version__} eager", "device": torch.cuda.get_device_name(),
        "precision": a.precision, "params": params, "step_ms_median": step_s * 1000,
        "tokens_per_s": tokens_per_s, "mfu": flops_per_token * tokens_per_s / a.peak,
        "loss_first": losses[0], "loss_last": losses[-1],
        "peak_memory_bytes": torch.cuda.max_memory_allocated(),
    }))


if __name__ == "__main__":
    main()
