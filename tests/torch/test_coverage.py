"""Coverage of the parity loops (docs/pytorch.md): which ATen ops of a GPT's, a Llama's and a
ResNet-18's training steps still run on a fallback, per Loom backend, against the committed report
tests/torch/coverage/loops.json — a new fallback (or one that went away: the report is then
updated) fails the test."""
import json
import os
import sys
import unittest

import loom_torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import models  # noqa: E402


class LoopCoverage(unittest.TestCase):
    def test_the_loops_fallbacks_are_the_committed_ones(self):
        with open(os.path.join(HERE, "coverage", "loops.json")) as f:
            expected = json.load(f)
        names = loom_torch.devices()
        loops = (("gpt", lambda device: models.train(models.Gpt, device, 2)),
                 ("llama", lambda device: models.train(models.Llama, device, 2)),
                 ("resnet", lambda device: models.train_images(models.resnet18, device, 2)))
        for kind, loop in loops:
            for backend in ("cpu", "opencl"):
                if backend not in names:
                    continue
                with self.subTest(model=kind, backend=backend):
                    loom_torch.device.reset_coverage()
                    loop(f"loom:{names.index(backend)}")
                    report = loom_torch.coverage()
                    measured = {path: sorted(c["op"] for c in report if c[path] > 0)
                                for path in ("pytorch_fallback", "loom_fallback")}
                    self.assertEqual(measured, expected[kind][backend])


if __name__ == "__main__":
    unittest.main()
