"""Writes tests/fixtures/decoders/<name>/: a tiny random model of each decoder family as
transformers defines it (config.json + model.safetensors, exactly what save_pretrained
writes) and reference.safetensors with what transformers computes on it: the logits of one
batch, the 16 tokens greedy generation appends to a prompt, the loss and every gradient,
the losses of 20 AdamW steps and the parameters after them. Loom's tests replay these without PyTorch.
Run: $(scripts/python-env --print) tools/make_decoder_fixtures.py"""
import json
import os

import torch
import transformers
from safetensors.torch import save_file
from transformers import (AutoModelForCausalLM, GPT2Config, LlamaConfig, MistralConfig, Qwen2Config,
                          Qwen3Config)

ROOT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "decoders")
B, T = 2, 24
STEPS = 20
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.95), 1e-8, 0.1
COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              max_position_embeddings=64, initializer_range=0.2)

# One configuration per family, each exercising what sets the family apart.
CONFIGS = {
    # Llama 3: grouped-query attention, head_dim != hidden/heads, llama3 rotary scaling
    # with a short original context (so all three frequency bands occur), every bias.
    "llama": LlamaConfig(**COMMON, num_attention_heads=4, num_key_value_heads=2, head_dim=12,
                         rms_norm_eps=1e-5, attention_bias=True, mlp_bias=True,
                         rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                           high_freq_factor=4.0,
                                           original_max_position_embeddings=16)),
    # Mistral: multi-query attention (one key/value head), a window longer than the batch.
    "mistral": MistralConfig(**COMMON, num_attention_heads=4, num_key_value_heads=1,
                             sliding_window=4096, rope_theta=1e6),
    # Qwen2: q/k/v biases, tied embeddings, linear rotary scaling.
    "qwen2": Qwen2Config(**COMMON, num_attention_heads=4, num_key_value_heads=2,
                         tie_word_embeddings=True,
                         rope_scaling=dict(rope_type="linear", factor=2.0)),
    # Qwen3: per-head q/k RMSNorm, head_dim 16 with 4 heads over hidden 32.
    "qwen3": Qwen3Config(**COMMON, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         tie_word_embeddings=False),
    # GPT-2 (Loom's gpt): learned positions, LayerNorm, fused q/k/v, tanh GELU, tied head.
    "gpt2": GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                       initializer_range=0.2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
}


def perturb(model):
    """Norm weights near 1 and biases away from 0, so every parameter's path matters."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name or (".ln_" in name and name.endswith(".weight")):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn_like(p))


def main():
    for seed, (name, config) in enumerate(CONFIGS.items()):
        torch.manual_seed(100 + seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").float()
        perturb(model)
        folder = os.path.join(ROOT, name)
        os.makedirs(folder, exist_ok=True)
        model.save_pretrained(folder, safe_serialization=True)
        os.remove(os.path.join(folder, "generation_config.json"))  # sampling defaults only

        x = torch.randint(0, config.vocab_size, (B, T))
        y = torch.randint(0, config.vocab_size, (B, T))
        out = {"batch.x": x.float(), "batch.y": y.float()}  # exact in f32
        logits = model(x).logits
        out["logits"] = logits.detach().reshape(B * T, -1).clone()
        # Greedy decoding (transformers' generate, with its KV cache) from the first row's
        # first 8 tokens: the 16 tokens it appends.
        with torch.no_grad():
            prompt = x[:1, :8]  # every position attended (a pad id in it must not mask it)
            greedy = model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                    max_new_tokens=16, do_sample=False, eos_token_id=None,
                                    pad_token_id=0)
        out["greedy.prompt"] = x[0, :8].float()
        out["greedy.tokens"] = greedy[0, 8:].float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(B * T, -1), y.reshape(-1))
        loss.backward()
        out["loss"] = loss.detach().reshape(1)
        for pname, p in model.named_parameters():
            out["grad." + pname] = p.grad.detach().clone()

        decay = [p for _, p in model.named_parameters() if p.dim() >= 2]
        no_decay = [p for _, p in model.named_parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=LR, betas=BETAS, eps=EPS)
        losses = []
        for _ in range(STEPS):
            opt.zero_grad()
            step_logits = model(x).logits.reshape(B * T, -1)
            step_loss = torch.nn.functional.cross_entropy(step_logits, y.reshape(-1))
            losses.append(step_loss.item())
            step_loss.backward()
            opt.step()
        out["adamw_losses"] = torch.tensor(losses)
        for pname, p in model.named_parameters():
            out["final." + pname] = p.detach().clone()
        meta = {"adamw": json.dumps(dict(lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
                                         steps=STEPS)),
                "torch": torch.__version__, "transformers": transformers.__version__}
        save_file({k: v.contiguous() for k, v in out.items()},
                  os.path.join(folder, "reference.safetensors"), metadata=meta)
        print(name, "loss", round(loss.item(), 6), "after", STEPS, "steps",
              round(losses[-1], 6))


if __name__ == "__main__":
    main()
