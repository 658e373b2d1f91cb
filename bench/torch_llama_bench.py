#!/usr/bin/env python3
"""Training-step benchmark of transformers' own LlamaForCausalLM (fp32, CPU), the anchor
of `loom train --model llama`'s speed: bench/compare_llama runs both on the same shape.

A random-config model (no downloads), random tokens, each step: zero_grad, forward with
labels-free logits, cross-entropy, backward, clip_grad_norm_(1.0), AdamW.step (decoupled
weight decay 0.1 on matrices and embeddings, betas 0.9/0.99), as loom train's step.
Prints ONE JSON line: step_ms_median over the timed steps, peak_rss_bytes of the process.

Usage: $(scripts/python-env --print) bench/torch_llama_bench.py --layers 4 --hidden 256 \\
         --heads 8 --kv-heads 4 --ffn 704 --seq 128 --batch 8 --vocab 4096 --threads 2 \\
         [--compile] [--sdpa]
"""
import argparse
import json
import resource
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=704)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (compile falls here)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--compile", action="store_true", help="torch.compile the model (inductor)")
    p.add_argument("--sdpa", action="store_true",
                   help="attention through scaled_dot_product_attention (default: eager)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.ffn,
                         num_hidden_layers=a.layers, num_attention_heads=a.heads,
                         num_key_value_heads=a.kv_heads, max_position_embeddings=a.seq,
                         rms_norm_eps=1e-6, tie_word_embeddings=False)
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa" if a.sdpa else "eager")
    model.train()
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-3, betas=(0.9, 0.99))
    forward = torch.compile(model) if a.compile else model
    gen = torch.Generator().manual_seed(1)

    def step():
        x = torch.randint(0, a.vocab, (a.batch, a.seq), generator=gen)
        y = torch.randint(0, a.vocab, (a.batch * a.seq,), generator=gen)
        opt.zero_grad(set_to_none=True)
        logits = forward(input_ids=x, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, a.vocab), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    for _ in range(a.warmup):
        step()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1000.0)
    print(json.dumps({"impl": "torch" + (".compile" if a.compile else " eager"),
                      "attention": "sdpa" if a.sdpa else "eager",
                      "step_ms_median": statistics.median(times),
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "params": sum(q.numel() for q in model.parameters()),
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
