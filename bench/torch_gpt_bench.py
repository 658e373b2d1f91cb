#!/usr/bin/python3
"""GPT-2-style decoder training/inference benchmark in plain torch.nn (fp32, CPU).

Self-contained: no downloads, random tokens. Prints ONE JSON line on stdout.

Model: token + learned position embedding, L pre-LN blocks
  x = x + proj(causal_softmax(q k^T / sqrt(hd)) v)   (q,k,v from one fused Linear d->3d)
  x = x + fc2(gelu_tanh(fc1(ln2(x))))                 (fc1: d->4d, fc2: 4d->d)
then final LayerNorm, LM head tied to the token embedding (no bias), cross-entropy.
All Linear layers have bias; init N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)),
biases 0, LN weight 1 / bias 0 (GPT-2 / nanoGPT convention). No dropout.

Training step = zero_grad + forward + loss + backward + AdamW.step.
By default the SAME batch is reused every step (so loss must fall: memorisation
check); --fresh-batch draws a new random batch each step instead.

Usage: /usr/bin/python3 bench/torch_gpt_bench.py --layers 2 --dim 128 --heads 4 \
         --seq 64 --batch 8 --vocab 65 --steps 20 --warmup 3 --threads 2 [--mode forward]

Loom's PyTorch reference: bench/compare_torch runs it beside `loom train`, and
bench/torch_ddp_gpt.py imports its GPT class. Its setups and the figures it gave are in
bench/README.md. Keep the model and the timing as they are, so that earlier figures stay
comparable.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=65)
    p.add_argument("--steps", type=int, default=20, help="timed steps (after warmup)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--mode", choices=["train", "forward"], default="train")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--fresh-batch", action="store_true",
                   help="new random batch every step (default: repeat one batch)")
    p.add_argument("--label", default="", help="free-form tag copied into the JSON")
    p.add_argument("--sdpa", action="store_true",
                   help="attention through F.scaled_dot_product_attention(is_causal=True), as current nanoGPT does")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model (inductor; compile time falls in the warmup steps)")
    return p.parse_args()


args = parse()
# Thread env must be set before torch (and the BLAS it links) is loaded.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, str(args.threads))
# OMP_WAIT_POLICY is left to the caller: with Debian's openblas-pthread build PASSIVE is
# much faster (torch's spinning OpenMP workers otherwise fight OpenBLAS's pthreads for the
# 2 cores); with the openblas-openmp build the default (spinning) is fastest. See
# bench/README.md.

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class Block(nn.Module):
    def __init__(self, d, h, T):
        super().__init__()
        self.h = h
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def attn(self, x):
        B, T, C = x.shape
        hd = C // self.h
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.h, hd).transpose(1, 2)  # B h T hd
        k = k.view(B, T, self.h, hd).transpose(1, 2)
        v = v.view(B, T, self.h, hd).transpose(1, 2)
        if args.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(self.mask[:T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, V, T, L, d, h):
        super().__init__()
        self.tok = nn.Embedding(V, d)
        self.pos = nn.Embedding(T, d)
        self.blocks = nn.ModuleList([Block(d, h, T) for _ in range(L)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, V, bias=False)
        self.head.weight = self.tok.weight  # tied
        self.apply(self._init)
        for b in self.blocks:
            for lin in (b.proj, b.fc2):
                nn.init.normal_(lin.weight, 0.0, 0.02 / math.sqrt(2 * L))

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.tok(idx) + self.pos(pos)[None]
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def blas_libs():
    """Which BLAS/LAPACK/oneDNN shared objects are actually mapped in this process."""
    found = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                base = os.path.basename(path)
                if any(k in base for k in ("blas", "lapack", "dnnl", "mkl", "blis", "gomp")):
                    found.add(os.path.realpath(path))
    except OSError:
        pass
    return sorted(found)


def openblas_info(libs):
    import ctypes
    for p in libs:
        if "openblas" in os.path.basename(p):
            try:
                lib = ctypes.CDLL(p)
                lib.openblas_get_corename.restype = ctypes.c_char_p
                return lib.openblas_get_corename().decode()
            except (OSError, AttributeError):
                return None
    return None


def flops_per_token(n_nonemb_matmul, L, T, d, V):
    """Approximate forward FLOPs per token (2 per MAC): matmul weights + attention + LM head."""
    # QK^T and AV: 2*T*d MACs per token per layer, counted over the full TxT scores
    # (this implementation computes the masked half too).
    attn = 2 * 2 * L * T * d
    return 2 * n_nonemb_matmul + attn + 2 * d * V


def main():
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    L, d, h, T, B, V = args.layers, args.dim, args.heads, args.seq, args.batch, args.vocab
    assert d % h == 0, "dim must be divisible by heads"
    model = GPT(V, T, L, d, h)
    step_model = torch.compile(model) if args.compile else model
    n_params = sum(p.numel() for p in model.parameters())  # tied weight counted once
    n_block_matmul = L * (d * 3 * d + d * d + d * 4 * d + 4 * d * d)  # 12 L d^2
    fpt = flops_per_token(n_block_matmul, L, T, d, V)
    # training ~= 3x forward (fwd + 2x for backward)
    flops_step = (3 if args.mode == "train" else 1) * fpt * B * T

    gen = torch.Generator().manual_seed(args.seed + 1)

    def batch():
        data = torch.randint(0, V, (B, T + 1), generator=gen)
        return data[:, :T].contiguous(), data[:, 1:].contiguous()

    x, y = batch()
    times, losses = [], []
    total = args.warmup + args.steps
    if args.mode == "train":
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr,
                                weight_decay=args.weight_decay)
        for i in range(total):
            if args.fresh_batch and i > 0:
                x, y = batch()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            _, loss = step_model(x, y)
            loss.backward()
            opt.step()
            dt = time.perf_counter() - t0
            losses.append(loss.item())
            if i >= args.warmup:
                times.append(dt)
    else:
        model.eval()
        with torch.no_grad():
            for i in range(total):
                if args.fresh_batch and i > 0:
                    x, y = batch()
                t0 = time.perf_counter()
                _, loss = step_model(x, y)
                dt = time.perf_counter() - t0
                losses.append(loss.item())
                if i >= args.warmup:
                    times.append(dt)

    med = statistics.median(times)
    libs = blas_libs()
    out = {
        "impl": "torch",
        "mode": args.mode,
        "label": args.label,
        "config": {"layers": L, "dim": d, "heads": h, "seq": T, "batch": B, "vocab": V,
                   "steps": args.steps, "warmup": args.warmup, "threads": args.threads,
                   "lr": args.lr, "weight_decay": args.weight_decay, "seed": args.seed,
                   "fresh_batch": args.fresh_batch, "dtype": "float32",
                   "sdpa": args.sdpa, "compile": args.compile,
                   "optimizer": "AdamW(betas=(0.9,0.999),eps=1e-8)"},
        "params": n_params,
        "step_ms_median": round(med * 1e3, 3),
        "step_ms_min": round(min(times) * 1e3, 3),
        "step_ms_max": round(max(times) * 1e3, 3),
        "step_ms_mean": round(statistics.mean(times) * 1e3, 3),
        "tokens_per_s": round(B * T / med, 1),
        "est_gflop_per_step": round(flops_step / 1e9, 3),
        "est_gflops": round(flops_step / med / 1e9, 2),
        "loss_first": round(losses[0], 5),
        "loss_last": round(losses[-1], 5),
        "loss_ln_vocab": round(math.log(V), 5),
        "loss_decreased": (losses[-1] < losses[0]) if args.mode == "train" else None,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "libs": libs,
        "openblas_core": openblas_info(libs),
        "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                 "OMP_WAIT_POLICY", "OPENBLAS_CORETYPE",
                                                 "LD_LIBRARY_PATH")},
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
