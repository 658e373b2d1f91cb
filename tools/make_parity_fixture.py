"""Writes tests/fixtures/gpt_parity.safetensors: a 2-layer GPT's weights, one batch,
its loss and every gradient, and the losses of 10 AdamW steps, all computed by PyTorch.
The Loom test suite replays them. Run: /usr/bin/python3 tools/make_parity_fixture.py"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from torch_gpt import GPT, write_safetensors  # noqa: E402

CFG = dict(vocab=65, context=16, layers=2, heads=2, width=32)
B, T = 3, 16
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.99), 1e-8, 0.1

torch.manual_seed(1234)
model = GPT(**CFG)
with torch.no_grad():
    for name, p in model.named().items():
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
            p.copy_(1.0 + 0.1 * torch.randn_like(p))
        else:  # biases too, so every parameter's gradient path is exercised
            p.copy_(0.02 * torch.randn_like(p) * (5 if "bias" in name else 1))
x = torch.randint(0, CFG["vocab"], (B, T))
y = torch.randint(0, CFG["vocab"], (B, T))

out = {name: p.detach().clone() for name, p in model.named().items()}
out["batch.x"] = x.float()
out["batch.y"] = y.float()
loss = model(x, y)
loss.backward()
out["loss"] = loss.detach().reshape(1)
for name, p in model.named().items():
    out["grad." + name] = p.grad.detach().clone()

decay = [p for n, p in model.named().items() if p.dim() >= 2]
no_decay = [p for n, p in model.named().items() if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=LR, betas=BETAS, eps=EPS)
losses = []
for step in range(10):
    opt.zero_grad()
    loss = model(x, y)
    losses.append(loss.item())
    loss.backward()
    opt.step()
out["adamw_losses"] = torch.tensor(losses)

path = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "gpt_parity.safetensors")
meta = {"config": json.dumps(CFG), "batch": f"{B}x{T}", "adamw": json.dumps(dict(lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)),
        "torch": torch.__version__}
write_safetensors(path, out, meta)
print("wrote", os.path.normpath(path), "loss", out["loss"].item(), "losses", [round(l, 5) for l in losses])
