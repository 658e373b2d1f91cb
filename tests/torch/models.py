"""The models of the PyTorch-device parity tests, in plain torch.nn: a nanoGPT-shaped GPT
(LayerNorm, GELU, a tied embedding and head, causal scaled_dot_product_attention) and a
Llama-shaped model (RMSNorm, rotary embeddings, SwiGLU, grouped-query attention), and the
training loop a script runs with them: only the device string changes."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class GptAttention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.qkv, self.out, self.heads = nn.Linear(width, 3 * width), nn.Linear(width, width), heads

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in self.qkv(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).contiguous().view(b, t, c))


class GptBlock(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(width), GptAttention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Gpt(nn.Module):
    def __init__(self, vocab=65, context=32, width=64, heads=4, layers=2):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(GptBlock(width, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)
        self.tokens.weight = self.head.weight  # tied, as nanoGPT's

    def forward(self, ids, targets):
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.tokens(ids) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, width, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, width // heads
        self.q = nn.Linear(width, width, bias=False)
        self.k = nn.Linear(width, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(width, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(width, width, bias=False)

    def forward(self, x, cos, sin):
        b, t, c = x.shape
        q = self.q(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o(y.transpose(1, 2).reshape(b, t, c))


class LlamaBlock(nn.Module):
    def __init__(self, width, heads, kv_heads, hidden):
        super().__init__()
        self.norm1, self.attn = nn.RMSNorm(width, eps=1e-5), LlamaAttention(width, heads, kv_heads)
        self.norm2 = nn.RMSNorm(width, eps=1e-5)
        self.gate = nn.Linear(width, hidden, bias=False)
        self.up = nn.Linear(width, hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.norm1(x), cos, sin)
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, vocab=65, context=32, width=64, heads=4, kv_heads=2, layers=2, hidden=172):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(LlamaBlock(width, heads, kv_heads, hidden) for _ in range(layers))
        self.norm, self.head = nn.RMSNorm(width, eps=1e-5), nn.Linear(width, vocab, bias=False)
        head_dim = width // heads
        frequencies = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(context).float(), frequencies)
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, ids, targets):
        t = ids.shape[1]
        x = self.tokens(ids)
        for block in self.blocks:
            x = block(x, self.cos[:t], self.sin[:t])
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def train(make_model, device, steps, seed=0):
    """`steps` AdamW steps of a fresh model on `device`: the losses and the final parameters
    (on the CPU)."""
    torch.manual_seed(seed)
    model = make_model().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, 65, (4, 32), generator=g)
    targets = torch.randint(0, 65, (4, 32), generator=g)
    ids, targets = ids.to(device), targets.to(device)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = model(ids, targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}
