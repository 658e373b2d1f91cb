"""GPT-2 in plain PyTorch, parameter for parameter the Hugging Face GPT2LMHeadModel
(pre-LN, LayerNorm eps 1e-5, tanh GELU, Conv1D [in, out] weights, tied LM head), plus
a minimal safetensors reader/writer. Shared by the fixture and checkpoint scripts.
Runs with Debian's python3-torch; needs no transformers or safetensors package."""
import json
import math
import struct

import torch
import torch.nn.functional as F


class GPT(torch.nn.Module):
    def __init__(self, vocab, context, layers, heads, width):
        super().__init__()
        self.heads = heads
        C = width
        p = {}
        p["transformer.wte.weight"] = torch.empty(vocab, C)
        p["transformer.wpe.weight"] = torch.empty(context, C)
        for i in range(layers):
            h = f"transformer.h.{i}."
            p[h + "ln_1.weight"] = torch.ones(C)
            p[h + "ln_1.bias"] = torch.zeros(C)
            p[h + "attn.c_attn.weight"] = torch.empty(C, 3 * C)
            p[h + "attn.c_attn.bias"] = torch.zeros(3 * C)
            p[h + "attn.c_proj.weight"] = torch.empty(C, C)
            p[h + "attn.c_proj.bias"] = torch.zeros(C)
            p[h + "ln_2.weight"] = torch.ones(C)
            p[h + "ln_2.bias"] = torch.zeros(C)
            p[h + "mlp.c_fc.weight"] = torch.empty(C, 4 * C)
            p[h + "mlp.c_fc.bias"] = torch.zeros(4 * C)
            p[h + "mlp.c_proj.weight"] = torch.empty(4 * C, C)
            p[h + "mlp.c_proj.bias"] = torch.zeros(C)
        p["transformer.ln_f.weight"] = torch.ones(C)
        p["transformer.ln_f.bias"] = torch.zeros(C)
        self.names = list(p.keys())
        self.params = torch.nn.ParameterList([torch.nn.Parameter(v) for v in p.values()])
        self.layers = layers

    def named(self):
        return dict(zip(self.names, self.params))

    def forward(self, idx, targets):
        P = self.named()
        B, T = idx.shape
        x = P["transformer.wte.weight"][idx] + P["transformer.wpe.weight"][:T]
        for i in range(self.layers):
            h = f"transformer.h.{i}."
            a = F.layer_norm(x, x.shape[-1:], P[h + "ln_1.weight"], P[h + "ln_1.bias"], 1e-5)
            qkv = a @ P[h + "attn.c_attn.weight"] + P[h + "attn.c_attn.bias"]
            q, k, v = qkv.split(x.shape[-1], dim=2)
            D = x.shape[-1] // self.heads
            q, k, v = (t.view(B, T, self.heads, D).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
            att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
            y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(B, T, -1)
            x = x + (y @ P[h + "attn.c_proj.weight"] + P[h + "attn.c_proj.bias"])
            m = F.layer_norm(x, x.shape[-1:], P[h + "ln_2.weight"], P[h + "ln_2.bias"], 1e-5)
            m = F.gelu(m @ P[h + "mlp.c_fc.weight"] + P[h + "mlp.c_fc.bias"], approximate="tanh")
            x = x + (m @ P[h + "mlp.c_proj.weight"] + P[h + "mlp.c_proj.bias"])
        x = F.layer_norm(x, x.shape[-1:], P["transformer.ln_f.weight"], P["transformer.ln_f.bias"], 1e-5)
        logits = x @ P["transformer.wte.weight"].t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def window_loss(model, ids, context, batch=64):
    """Mean cross-entropy over all consecutive non-overlapping windows of `context` tokens
    (the definition `loom eval` and Loom's final val_loss use)."""
    windows = (len(ids) - 1) // context
    x = ids[: windows * context].view(windows, context)
    y = ids[1: windows * context + 1].view(windows, context)
    total = 0.0
    with torch.no_grad():
        for i in range(0, windows, batch):
            total += model(x[i:i + batch], y[i:i + batch]).item() * x[i:i + batch].numel()
    return total / x.numel(), windows


def write_safetensors(path, tensors, metadata=None):
    header, offset, blobs = {}, 0, []
    if metadata:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        data = t.detach().contiguous().to(torch.float32).numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in header.items():
        assert e["dtype"] == "F32", f"{path}: {name} is {e['dtype']}"
        b, end = e["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[b:end]), dtype=torch.float32).reshape(e["shape"])
    return out, meta
