"""The migration helper (python/loom_torch/transfer.py): a training script written for CUDA
runs on the loom device with one import added, trains as on PyTorch's CPU device, and the
helper says what it rewrote."""
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))

# A script as written for an NVIDIA GPU: device strings, torch.cuda calls, automatic mixed
# precision with a gradient scaler. The first line is the only change for loom.
CUDA_SCRIPT = """
{first_line}
import sys
import torch
sys.path.insert(0, {here!r})
import models

assert torch.cuda.is_available()
torch.cuda.manual_seed_all(0)
torch.manual_seed(0)
device = torch.device("cuda")
model = models.Llama().cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
scaler = torch.cuda.amp.GradScaler()
g = torch.Generator().manual_seed(1)
ids = torch.randint(0, 65, (4, 32), generator=g).to(device)
targets = torch.randint(0, 65, (4, 32), generator=g).to("cuda:0", non_blocking=True)
mask = torch.ones(4, 32, device="cuda")
for step in range(5):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type="cuda", dtype=torch.float16):
        loss = model(ids, targets) * mask.mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    torch.cuda.synchronize()
    print(loss.item())
print(ids.device.type, next(model.parameters()).device.type)
"""


def run(first_line, env=None):
    script = CUDA_SCRIPT.format(first_line=first_line, here=HERE)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})))


class Transfer(unittest.TestCase):
    def test_a_cuda_script_trains_on_loom_as_on_the_cpu_and_the_rewrites_are_listed(self):
        on_loom = run("import loom_torch.transfer")
        self.assertEqual(on_loom.returncode, 0, on_loom.stderr)
        *losses, devices = on_loom.stdout.split("\n")[:-1]
        self.assertEqual(devices, "loom loom")
        # The same loop on PyTorch's CPU device: cuda rewritten to cpu by hand.
        cpu_script = CUDA_SCRIPT.format(first_line="", here=HERE)
        for old, new in (('torch.device("cuda")', 'torch.device("cpu")'), (".cuda()", ""),
                         ('"cuda:0"', '"cpu"'), ('device="cuda"', 'device="cpu"'),
                         ("assert torch.cuda.is_available()", ""),
                         ("torch.cuda.synchronize()", ""),
                         ('device_type="cuda", dtype=torch.float16', 'device_type="cpu", enabled=False'),
                         ("torch.cuda.amp.GradScaler()", 'torch.amp.GradScaler("cpu", enabled=False)')):
            cpu_script = cpu_script.replace(old, new)
        on_cpu = subprocess.run([sys.executable, "-c", cpu_script], capture_output=True, text=True)
        self.assertEqual(on_cpu.returncode, 0, on_cpu.stderr)
        *expected, _ = on_cpu.stdout.split("\n")[:-1]
        self.assertEqual(len(losses), 5)
        for got, want in zip(map(float, losses), map(float, expected)):
            self.assertLess(abs(got - want) / abs(want), 1e-4)
        self.assertLess(float(losses[-1]), float(losses[0]))
        summary = on_loom.stderr.strip().splitlines()[-1]
        self.assertTrue(summary.startswith("loom_torch.transfer: rewrote cuda to loom in "), summary)
        for rewritten in ("Module.cuda x1", "Tensor.to x2", "torch.ones x1",
                          "torch.cuda.is_available x1", "torch.cuda.synchronize x5",
                          # the script's call, and torch.manual_seed's own
                          "torch.cuda.manual_seed_all x2", "autocast (to float32) x5",
                          "GradScaler (disabled) x1"):
            self.assertIn(rewritten, summary)

    def test_without_the_import_the_script_is_untouched(self):
        plain = run("")
        self.assertNotEqual(plain.returncode, 0)  # no CUDA here: is_available() is False
        self.assertIn("AssertionError", plain.stderr)

    def test_quiet_leaves_the_summary_out(self):
        quiet = run("import loom_torch.transfer", {"LOOM_TORCH_TRANSFER_QUIET": "1"})
        self.assertEqual(quiet.returncode, 0, quiet.stderr)
        self.assertNotIn("loom_torch.transfer", quiet.stderr)


if __name__ == "__main__":
    unittest.main()
