#!/usr/bin/env python3
"""Export models with current PyTorch (2.x, from PyPI) the way a user would today, and
record ONNX Runtime's outputs for them.

Run with the repository's pinned environment (scripts/python-env):
    $(scripts/python-env --print) tools/export_pytorch2.py [OUT_DIR]
OUT_DIR defaults to tests/fixtures/onnx/pytorch2.

Models (random weights from torch.manual_seed(0); nothing is downloaded or pretrained):
  gpt2            a GPT-2-style decoder: token and position embeddings, 2 pre-norm blocks of
                  causal self-attention (scaled_dot_product_attention, is_causal) and a
                  tanh-GELU MLP, a final LayerNorm and an LM head tied to the token embedding
  resnet          a ResNet-18-shaped CNN (BasicBlocks [2,2,2,2], widths 8-64, 1x1 projection
                  shortcuts, BatchNorm, global average pool) for 32x32 images
  mobilenet       a MobileNetV2-shaped CNN (inverted residuals: 1x1 expand, 3x3 depthwise,
                  1x1 project; ReLU6; BatchNorm) for 32x32 images

Each model is exported twice, in eval mode, with static shapes (gpt2 also with its batch
and sequence axes symbolic, as gpt2_dynamic.<exporter>; resnet also by the TorchScript
exporter in training mode, BatchNormalization on batch statistics, as resnet_train):
  <name>.dynamo.onnx         torch.onnx.export(..., dynamo=True), opset 18 (the default exporter)
  <name>.torchscript.onnx    torch.onnx.export(..., dynamo=False), opset 17 (the TorchScript one)
and for each export a folder in the layout of ONNX's backend tests:
  <name>.<exporter>/test_data_set_0/input_0.pb    the example input
  <name>.<exporter>/test_data_set_0/output_0.pb   ONNX Runtime's output for it (the reference)
plus manifest.json: versions, op histograms, sizes, and PyTorch's and ONNX Runtime's
largest difference per export (how far the export itself moves the result).
"""
import collections
import hashlib
import json
import math
import os
import sys

import numpy as np
import onnx
import onnxruntime
import torch
import torch.nn.functional as F
from onnx import numpy_helper

DYNAMO_OPSET = 18
TORCHSCRIPT_OPSET = 17


class CausalSelfAttention(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.c_attn = torch.nn.Linear(d, 3 * d)
        self.c_proj = torch.nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        # [b, t, d] -> [b, heads, t, d / heads]
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d))


class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads)
        self.ln_2 = torch.nn.LayerNorm(d)
        self.c_fc = torch.nn.Linear(d, 4 * d)
        self.c_proj = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(torch.nn.Module):
    def __init__(self, vocab=65, ctx=32, d=64, heads=4, layers=2):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, d)
        self.wpe = torch.nn.Embedding(ctx, d)
        self.h = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(d)
        self.lm_head = torch.nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2
        for name, p in self.named_parameters():  # GPT-2's initialisation
            if p.dim() >= 2:
                torch.nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class BasicBlock(torch.nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.shortcut = torch.nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False),
                                                torch.nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet(torch.nn.Module):
    def __init__(self, widths=(8, 16, 32, 64), blocks=(2, 2, 2, 2), classes=10):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, widths[0], 3, 1, 1, bias=False),
                                        torch.nn.BatchNorm2d(widths[0]), torch.nn.ReLU())
        layers, cin = [], widths[0]
        for i, (w, n) in enumerate(zip(widths, blocks)):
            for j in range(n):
                layers.append(BasicBlock(cin, w, 2 if i > 0 and j == 0 else 1))
                cin = w
        self.layers = torch.nn.Sequential(*layers)
        self.fc = torch.nn.Linear(cin, classes)

    def forward(self, x):
        y = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


class InvertedResidual(torch.nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        mid = cin * expand
        self.residual = stride == 1 and cin == cout
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(cin, mid, 1, bias=False), torch.nn.BatchNorm2d(mid), torch.nn.ReLU6(),
            torch.nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False),
            torch.nn.BatchNorm2d(mid), torch.nn.ReLU6(),
            torch.nn.Conv2d(mid, cout, 1, bias=False), torch.nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.body(x)
        return x + y if self.residual else y


class MobileNet(torch.nn.Module):
    # (expansion, channels, repeats, first stride), MobileNetV2's table at a small width
    SETTINGS = ((1, 8, 1, 1), (4, 12, 2, 2), (4, 16, 2, 2), (4, 24, 1, 1))

    def __init__(self, classes=10):
        super().__init__()
        layers = [torch.nn.Conv2d(3, 8, 3, 1, 1, bias=False), torch.nn.BatchNorm2d(8),
                  torch.nn.ReLU6()]
        cin = 8
        for t, c, n, s in self.SETTINGS:
            for j in range(n):
                layers.append(InvertedResidual(cin, c, s if j == 0 else 1, t))
                cin = c
        layers += [torch.nn.Conv2d(cin, 64, 1, bias=False), torch.nn.BatchNorm2d(64),
                   torch.nn.ReLU6()]
        self.features = torch.nn.Sequential(*layers)
        self.classifier = torch.nn.Sequential(torch.nn.Dropout(0.2), torch.nn.Linear(64, classes))

    def forward(self, x):
        y = F.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(y, 1))


def randomise_batchnorm(model):
    """Give BatchNorm non-trivial running statistics and affine terms, so the check covers
    them (a fresh BatchNorm is the identity in eval mode up to its epsilon)."""
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)


def models():
    torch.manual_seed(0)
    yield "gpt2", GPT2(), torch.randint(0, 65, (2, 32))
    resnet = ResNet()
    randomise_batchnorm(resnet)
    yield "resnet", resnet, torch.randn(2, 3, 32, 32)
    mobilenet = MobileNet()
    randomise_batchnorm(mobilenet)
    yield "mobilenet", mobilenet, torch.randn(2, 3, 32, 32)


def export(model, x, path, exporter, dynamic, training=False):
    """dynamic: the batch and sequence axes of a token model's input stay symbolic, so the
    graph computes its shapes at run time (Shape, Range, Trilu, ...) as exports for serving do."""
    if exporter == "dynamo":
        shapes = None
        if dynamic:
            shapes = {"idx": {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq", max=32)}}
        program = torch.onnx.export(model, (x,), dynamo=True, opset_version=DYNAMO_OPSET,
                                    input_names=["input"], output_names=["output"],
                                    dynamic_shapes=shapes)
        program.save(path)  # weights inline: these models are small
    else:
        axes = {"input": {0: "batch", 1: "seq"}, "output": {0: "batch", 1: "seq"}}
        mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
        torch.onnx.export(model, (x,), path, dynamo=False, opset_version=TORCHSCRIPT_OPSET,
                          input_names=["input"], output_names=["output"],
                          dynamic_axes=axes if dynamic else None, training=mode,
                          do_constant_folding=not training)
    m = onnx.load(path)
    onnx.checker.check_model(m)
    return m


def save_pb(array, path):
    with open(path, "wb") as f:
        f.write(numpy_helper.from_array(np.ascontiguousarray(array)).SerializeToString())


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "tests/fixtures/onnx/pytorch2")
    os.makedirs(out, exist_ok=True)
    manifest = {"torch": torch.__version__, "onnx": onnx.__version__,
                "onnxruntime": onnxruntime.__version__, "numpy": np.__version__, "exports": {}}
    for name, model, x in models():
        model.eval()
        with torch.no_grad():
            want_torch = model(x).numpy()
        variants = [(name, exporter, False, False) for exporter in ("dynamo", "torchscript")]
        if name == "gpt2":
            variants += [(name + "_dynamic", e, True, False) for e in ("dynamo", "torchscript")]
        if name == "resnet":  # BatchNormalization kept in training form (training_mode = 1)
            variants.append((name + "_train", "torchscript", False, True))
        for stem, exporter, dynamic, training in variants:
            tag = f"{stem}.{exporter}"
            path = os.path.join(out, tag + ".onnx")
            model.train(training)
            m = export(model, x, path, exporter, dynamic, training)
            model.eval()  # a training export runs the model once in training mode
            if training:
                with torch.no_grad():
                    model.train(True)
                    want_torch = model(x).numpy()  # batch statistics, as the graph computes
                    model.eval()
            session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
            feed = {session.get_inputs()[0].name: x.numpy()}
            ort_out = session.run(None, feed)[0]
            folder = os.path.join(out, tag, "test_data_set_0")
            os.makedirs(folder, exist_ok=True)
            save_pb(x.numpy(), os.path.join(folder, "input_0.pb"))
            save_pb(ort_out, os.path.join(folder, "output_0.pb"))
            ops = collections.Counter(n.op_type for n in m.graph.node)
            params = sum(int(numpy_helper.to_array(i).size) for i in m.graph.initializer)
            entry = {
                "opset": max(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")),
                "producer": f"{m.producer_name} {m.producer_version}".strip(),
                "nodes": len(m.graph.node), "initialized_values": params,
                "bytes": os.path.getsize(path), "sha256": sha256(path),
                "ops": dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))),
                "max_abs_torch_vs_onnxruntime": float(np.max(np.abs(ort_out - want_torch))),
                "max_abs_onnxruntime_output": float(np.max(np.abs(ort_out))),
            }
            manifest["exports"][tag] = entry
            print(f"{tag}: opset {entry['opset']}, {entry['nodes']} nodes, {params} values, "
                  f"{entry['bytes']} bytes, |torch - ort| {entry['max_abs_torch_vs_onnxruntime']:.3g}"
                  f"\n  {entry['ops']}", flush=True)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
