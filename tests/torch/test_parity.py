"""Training parity (docs/pytorch.md): a standard PyTorch training loop with only the device
string changed — 20 AdamW steps of a nanoGPT-shaped GPT and of a Llama-shaped model — gives
per-step losses within 1e-4 relative of PyTorch's CPU device and final parameters within
1e-3 (max |a - b| over max |b|, per tensor), the loss falling, on every Loom device."""
import os
import sys
import unittest

import torch

import loom_torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

STEPS = 20


class TrainingParity(unittest.TestCase):
    def check(self, make_model):
        reference, reference_params = models.train(make_model, "cpu", STEPS)
        for index, name in enumerate(loom_torch.devices()):
            device = f"loom:{index}"
            with self.subTest(device=device, backend=name):
                losses, params = models.train(make_model, device, STEPS)
                worst = max(abs(a - b) / abs(b) for a, b in zip(losses, reference))
                self.assertLess(worst, 1e-4, (losses, reference))
                self.assertLess(losses[-1], losses[0])
                for key, expected in reference_params.items():
                    got = params[key]
                    if key.endswith("attn.qkv.bias"):
                        # The key bias's gradient is zero in exact arithmetic (softmax does not
                        # change when every score of a row moves by the same q.b), so each
                        # library's rounding noise is all it gets, and AdamW scales noise to
                        # steps of the learning rate: compared are the query and value biases.
                        width = expected.shape[0] // 3
                        got = torch.cat([got[:width], got[2 * width:]])
                        expected = torch.cat([expected[:width], expected[2 * width:]])
                    diff = (got - expected).abs().max() / expected.abs().max()
                    self.assertLess(diff.item(), 1e-3, key)

    def test_gpt(self):
        self.check(models.Gpt)

    def test_llama(self):
        self.check(models.Llama)


if __name__ == "__main__":
    unittest.main()
