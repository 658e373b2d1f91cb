"""Loads a Loom GPT checkpoint into the equivalent PyTorch model (tools/torch_gpt.py, the
Hugging Face GPT-2 parameterisation) and checks that PyTorch and `loom eval` give the
same loss on the same text, within 1e-4 relative.

  /usr/bin/python3 tools/torch_check_checkpoint.py out/checkpoint [--data FILE] [--loom build/release/loom]

The loss is the mean cross-entropy over all consecutive non-overlapping windows of the
model's context (the definition `loom eval` uses). By default the text is the validation
split (last 10%) of tiny Shakespeare. Exits 1 when the two disagree."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(__file__))
from torch_gpt import GPT, read_safetensors, window_loss  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("checkpoint")
    p.add_argument("--data", default=None)
    p.add_argument("--loom", default=os.path.join(ROOT, "build", "release", "loom"))
    args = p.parse_args()
    path = args.checkpoint
    if os.path.isdir(path):
        path = os.path.join(path, "model.safetensors")
    weights, meta = read_safetensors(path)
    spec = json.loads(meta["loom_model"])
    vocab = meta["loom_vocab"]
    model = GPT(spec["vocab"], spec["context"], spec["layers"], spec["heads"], spec["width"])
    missing = set(model.names) - set(weights)
    if missing:
        sys.exit(f"{path}: missing {sorted(missing)}")
    with torch.no_grad():
        for name, param in model.named().items():
            param.copy_(weights[name])

    data_path = args.data
    if data_path is None:
        with open(os.path.join(ROOT, "data", "tinyshakespeare", "input.txt"), encoding="utf-8") as f:
            text = f.read()
        text = text[int(len(text) * 0.9):]
        tmp = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8")
        tmp.write(text)
        tmp.close()
        data_path = tmp.name
    with open(data_path, encoding="utf-8") as f:
        text = f.read()
    index = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([index[c] for c in text])
    torch_loss, windows = window_loss(model, ids, spec["context"])

    out = subprocess.run([args.loom, "eval", args.checkpoint, "--data", data_path, "--json"],
                         capture_output=True, text=True, check=True)
    loom_loss = json.loads(out.stdout.strip().splitlines()[-1])["loss"]
    rel = abs(torch_loss - loom_loss) / abs(torch_loss)
    print(json.dumps({"checkpoint": path, "data": data_path, "windows": windows, "torch_loss": round(torch_loss, 6),
                      "loom_loss": round(loom_loss, 6), "relative_difference": rel, "ok": rel <= 1e-4}))
    sys.exit(0 if rel <= 1e-4 else 1)


if __name__ == "__main__":
    main()
