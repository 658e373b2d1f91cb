"""The PyTorch device "loom" (python/loom_torch, src/torch): tensors move to every Loom
device and back bitwise, read, print and save as PyTorch's do; mapped ops run on Loom's
kernels and agree with PyTorch's CPU device; every op is in the coverage report with its
path; bad use is a PyTorch error naming the device, op and dtype.

Run: PYTHONPATH=<build>/python <the pinned python> -m unittest tests/torch/test_device.py
(`make torch` builds the extension and runs this)."""
import io
import os
import subprocess
import sys
import unittest

import torch

import loom_torch


def loom_devices():
    return [f"loom:{i}" for i in range(len(loom_torch.devices()))]


def bits(x):
    """The bytes of x's elements in row-major order (bool: its values)."""
    x = x.contiguous()
    return x if x.dtype == torch.bool else x.view(torch.uint8)


def coverage_of(op):
    return next((c for c in loom_torch.coverage() if c["op"] == op), None)


class Devices(unittest.TestCase):
    def test_devices_are_listed_in_the_documented_order(self):
        names = loom_torch.devices()
        self.assertEqual(names[0], "cpu")
        order = ["cpu", "opencl", "cuda", "partial"]
        self.assertEqual(names, sorted(names, key=order.index))
        self.assertIn("partial", names)
        self.assertEqual(torch.loom.device_count(), len(names))
        self.assertTrue(torch.loom.is_available())

    def test_import_torch_alone_loads_the_device_and_the_switch_turns_it_off(self):
        """The "torch.backends" entry point: an unmodified script only names the device."""
        script = "import torch; x = torch.ones(2, device='loom'); print(torch.loom.device_count(), (x + x).tolist())"
        run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertEqual(run.stdout.split(), [str(len(loom_torch.devices())), "[2.0,", "2.0]"])
        env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
        script = "import sys, torch; print(hasattr(torch, 'loom'), 'loom_torch' in sys.modules)"
        run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertEqual(run.stdout.split(), ["False", "False"])

    def test_the_report_is_written_at_exit_and_loom_ops_shows_it(self):
        import json
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "report.json")
            script = ("import torch; x = torch.randn(3, 3, device='loom'); "
                      "(x @ x).sum().item(); torch.isin(x, x)")
            env = dict(os.environ, LOOM_TORCH_REPORT=path)
            run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
            self.assertEqual(run.returncode, 0, run.stderr)
            with open(path) as f:
                report = json.load(f)
            self.assertEqual(report["schema_version"], 1)
            self.assertEqual(report["devices"], loom_torch.devices())
            ops = {o["op"]: o for o in report["ops"]}
            self.assertEqual(ops["mm.out"]["native"], 1)
            self.assertEqual(ops["isin.Tensor_Tensor_out"]["pytorch_fallback"], 1)
            self.assertEqual(os.listdir(d), ["report.json"])  # no temporary left behind
            # The loom program of the same build reads it back.
            loom = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
                os.path.abspath(loom_torch.__file__)))), "loom")
            if not os.path.exists(loom):
                self.skipTest(f"no loom program at {loom}")
            table = subprocess.run([loom, "ops", "--torch_report", path], capture_output=True,
                                   text=True)
            self.assertEqual(table.returncode, 0, table.stderr)
            rows = [line.split()[:2] for line in table.stdout.splitlines()[2:-1]]
            self.assertIn(["isin.Tensor_Tensor_out", "pytorch"], rows)
            self.assertIn(["mm.out", "native"], rows)
            paths = [row[1] for row in rows]  # fallbacks listed first
            self.assertEqual(paths, sorted(paths, key=lambda p: p == "native"))

    def test_the_documented_op_list_is_the_registered_one(self):
        import re
        import textwrap
        doc = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs",
                           "pytorch.md")
        with open(doc) as f:
            text = f.read()
        block = text.split("<!-- mapped-ops: begin -->")[1].split("<!-- mapped-ops: end -->")[0]
        listed = re.findall(r"`([^`]+)`", block)
        ops = loom_torch.mapped_ops()
        self.assertEqual(listed, ops, "docs/pytorch.md's list, from torch.loom.mapped_ops():\n" +
                         textwrap.fill(", ".join(f"`{o}`" for o in ops), 92))

    def test_an_unknown_index_is_an_error_naming_the_devices_there_are(self):
        with self.assertRaises(RuntimeError) as caught:
            torch.ones(2).to(f"loom:{len(loom_torch.devices()) + 5}")
        message = str(caught.exception)
        self.assertIn("no device loom:", message)
        self.assertIn("loom:0 (cpu)", message)

    def test_a_dtype_loom_has_no_kernels_for_is_held_and_runs_on_pytorchs_kernels(self):
        # float64: held as bytes on every device; its ops take PyTorch's CPU kernels, counted.
        loom_torch.device.reset_coverage()
        t = torch.linspace(0, 1, 5, dtype=torch.float64)
        for device in loom_devices():
            with self.subTest(device=device):
                x = t.to(device)
                self.assertTrue(torch.equal(x.cpu(), t))
                self.assertTrue(torch.equal((x + x).cpu(), t + t))
        self.assertEqual(coverage_of("add.out")["pytorch_fallback"], len(loom_devices()))


class RoundTrips(unittest.TestCase):
    def cases(self):
        g = torch.Generator().manual_seed(1)
        base = torch.randn(6, 8, generator=g)
        return {
            "contiguous": base,
            "transposed": base.t(),
            "sliced": base[1:5, ::2],
            "offset": base.flatten()[3:27],
            "int64": torch.arange(-5, 7),
            "bool": base > 0,
            "bfloat16": base.to(torch.bfloat16),
        }

    def test_cpu_to_loom_and_back_is_bitwise_on_every_device(self):
        for device in loom_devices():
            for name, t in self.cases().items():
                with self.subTest(device=device, case=name):
                    moved = t.to(device)
                    self.assertEqual(moved.device, torch.device(device))
                    self.assertEqual(moved.dtype, t.dtype)
                    back = moved.cpu()
                    self.assertTrue(torch.equal(bits(back), bits(t)))

    def test_views_of_loom_tensors_read_back_as_the_cpu_views(self):
        t = torch.randn(5, 7)
        for device in loom_devices():
            with self.subTest(device=device):
                x = t.to(device)
                self.assertTrue(torch.equal(x.t().cpu(), t.t()))
                self.assertTrue(torch.equal(x[2:4, 1:6].cpu(), t[2:4, 1:6]))
                self.assertTrue(torch.equal(x.t().contiguous().cpu(), t.t().contiguous()))
                self.assertTrue(torch.equal(x.reshape(35).cpu(), t.reshape(35)))

    def test_item_printing_and_save_load(self):
        t = torch.tensor([[1.5, -2.25], [3.0, 4.125]])
        x = t.to("loom")
        self.assertEqual(x[1, 1].item(), 4.125)
        self.assertIn("4.1250", repr(x))
        self.assertIn("device='loom:0'", repr(x))
        buffer = io.BytesIO()
        torch.save({"x": x}, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer)["x"]
        self.assertEqual(loaded.device, torch.device("loom:0"))
        self.assertTrue(torch.equal(loaded.cpu(), t))

    def test_a_module_and_its_state_dict_move(self):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        reference = {k: v.clone() for k, v in model.state_dict().items()}
        model.to("loom")
        self.assertTrue(all(p.device.type == "loom" for p in model.parameters()))
        state = {k: v.cpu() for k, v in model.state_dict().items()}
        for k in reference:
            self.assertTrue(torch.equal(state[k], reference[k]), k)

    def test_a_tied_weight_stays_tied(self):
        embedding = torch.nn.Embedding(10, 4)
        head = torch.nn.Linear(4, 10, bias=False)
        head.weight = embedding.weight
        model = torch.nn.ModuleDict({"embedding": embedding, "head": head}).to("loom")
        self.assertIs(model["embedding"].weight, model["head"].weight)


class MappedOps(unittest.TestCase):
    def setUp(self):
        loom_torch.device.reset_coverage()

    def check_against_cpu(self, cases):
        """Each case f(t), t moving its inputs, on every loom device against PyTorch's CPU
        device: within 2e-6 of the largest value, and its ATen op (the key) on Loom."""
        for device in loom_devices():
            loom_torch.device.reset_coverage()
            for op, f in cases.items():
                with self.subTest(device=device, op=op):
                    expected = f(lambda v: v)
                    got = f(lambda v: v.to(device)).cpu()
                    self.assertEqual(got.shape, expected.shape)
                    scale = max(expected.abs().max().item(), 1e-30)
                    self.assertLess(((got - expected).abs().max() / scale).item(), 2e-6, op)
                    record = coverage_of(op)
                    self.assertIsNotNone(record, op)
                    self.assertEqual(record["pytorch_fallback"], 0, op)

    def test_add_mul_mm_agree_with_the_cpu_device_and_run_on_loom(self):
        g = torch.Generator().manual_seed(2)
        a, b = torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)
        w = torch.randn(16, 5, generator=g)
        for device in loom_devices():
            with self.subTest(device=device):
                la, lb, lw = a.to(device), b.to(device), w.to(device)
                self.assertTrue(torch.equal((la + lb).cpu(), a + b))
                self.assertTrue(torch.equal(torch.add(la, lb, alpha=0.5).cpu(), torch.add(a, b, alpha=0.5)))
                self.assertTrue(torch.equal((la * lb).cpu(), a * b))
                self.assertTrue(torch.equal((la * 3.0).cpu(), a * 3.0))
                product = (la @ lw).cpu()
                expected = a @ w
                self.assertLess(((product - expected).abs().max() / expected.abs().max()).item(), 1e-6)
        for op in ("add.out", "mul.out", "mm.out"):
            record = coverage_of(op)
            self.assertIsNotNone(record, op)
            self.assertGreaterEqual(record["calls"], len(loom_devices()))
            self.assertEqual(record["pytorch_fallback"], 0, op)
            self.assertEqual(record["native"] + record["decomposed"] + record["loom_fallback"],
                             record["calls"], op)
        # Loom's CPU backend has every one of them natively.
        self.assertGreaterEqual(coverage_of("mm.out")["native"], 1)

    def test_the_elementwise_reduction_softmax_and_batched_ops_agree_with_the_cpu_device(self):
        g = torch.Generator().manual_seed(3)
        x = torch.randn(4, 6, 10, generator=g)
        y = torch.randn(4, 6, 10, generator=g)
        positive = x.abs() + 0.1
        batched = torch.randn(4, 10, 3, generator=g)
        cases = {
            "sub.out": lambda t: torch.sub(t(x), t(y), alpha=2.0),
            "div.out": lambda t: t(x) / t(positive),
            "neg.out": lambda t: -t(x),
            "sqrt.out": lambda t: torch.sqrt(t(positive)),
            "exp.out": lambda t: torch.exp(t(x)),
            "log.out": lambda t: torch.log(t(positive)),
            "tanh.out": lambda t: torch.tanh(t(x)),
            "erf.out": lambda t: torch.erf(t(x)),
            "silu.out": lambda t: torch.nn.functional.silu(t(x)),
            "sum.IntList_out": lambda t: t(x).sum(dim=(0, 2), keepdim=True),
            "mean.out": lambda t: t(x).mean(dim=-1),
            "_softmax.out": lambda t: torch.softmax(t(x), dim=-1),
            "_log_softmax.out": lambda t: torch.log_softmax(t(x), dim=-1),
            "bmm.out": lambda t: torch.bmm(t(x[:, :, :]), t(batched)),
            "arange.start_out": lambda t: torch.arange(2.0, 9.0, 0.5, device=t(x).device)
            + torch.arange(14, device=t(x).device),
        }
        self.check_against_cpu(cases)

    def test_the_optimizer_and_activation_ops_agree_with_the_cpu_device(self):
        g = torch.Generator().manual_seed(5)
        x, y, z = (torch.randn(6, 9, generator=g) for _ in range(3))
        positive = z.abs() + 0.5
        bias, w = torch.randn(9, generator=g), torch.randn(9, 9, generator=g)
        cases = {
            "addcmul.out": lambda t: torch.addcmul(t(x), t(y), t(z), value=0.3),
            "addcdiv.out": lambda t: torch.addcdiv(t(x), t(y), t(positive), value=-0.7),
            "lerp.Scalar_out": lambda t: torch.lerp(t(x), t(y), 0.3) + torch.lerp(t(x), t(y), 0.8),
            "pow.Tensor_Scalar_out": lambda t: (t(x) ** 2 + t(positive) ** 0.5 + t(positive) ** -0.5
                                                + t(x) ** 3),
            "rsqrt.out": lambda t: torch.rsqrt(t(positive)),
            "sigmoid.out": lambda t: torch.sigmoid(t(x)),
            "gelu.out": lambda t: (torch.nn.functional.gelu(t(x))
                                   + torch.nn.functional.gelu(t(x), approximate="tanh")),
            "where.self_out": lambda t: torch.where(t(x) > 0, t(y), t(z)),
            "cat.out": lambda t: torch.cat([t(x), t(y)], dim=1),
            "addmm.out": lambda t: torch.addmm(t(bias), t(x), t(w)),
        }
        self.check_against_cpu(cases)
        # An exponent the map does not take runs on PyTorch's kernels, counted.
        loom_torch.device.reset_coverage()
        self.assertTrue(torch.equal((positive.to("loom") ** 1.7).cpu(), positive ** 1.7))
        self.assertEqual(coverage_of("pow.Tensor_Scalar_out")["pytorch_fallback"], 1)

    def test_a_small_network_trains_as_on_the_cpu_device(self):
        def run(device):
            torch.manual_seed(7)
            model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(approximate="tanh"),
                                        torch.nn.Linear(32, 5)).to(device)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
            g = torch.Generator().manual_seed(8)
            inputs, targets = torch.randn(16, 12, generator=g), torch.randn(16, 5, generator=g)
            losses = []
            for _ in range(5):
                optimizer.zero_grad()
                out = torch.log_softmax(model(inputs.to(device)), dim=-1)
                loss = ((out - targets.to(device)) ** 2).mean()
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
            return losses
        reference = run("cpu")
        for device in loom_devices():
            with self.subTest(device=device):
                losses = run(device)
                for a, b in zip(losses, reference):
                    self.assertLess(abs(a - b) / abs(b), 1e-5, (losses, reference))
                self.assertLess(losses[-1], losses[0])

    def test_softmax_gradients_run_on_loom_and_agree(self):
        g = torch.Generator().manual_seed(4)
        x = torch.randn(5, 7, generator=g)
        for device in loom_devices():
            loom_torch.device.reset_coverage()
            with self.subTest(device=device):
                for f, op in ((torch.softmax, "_softmax_backward_data.out"),
                              (torch.log_softmax, "_log_softmax_backward_data.out")):
                    a = x.clone().requires_grad_()
                    b = x.to(device).requires_grad_()
                    weights = torch.linspace(-1, 1, 35).reshape(5, 7)
                    (f(a, dim=-1) * weights).sum().backward()
                    (f(b, dim=-1) * weights.to(device)).sum().backward()
                    diff = (b.grad.cpu() - a.grad).abs().max() / a.grad.abs().max()
                    self.assertLess(diff.item(), 2e-6, op)
                    self.assertEqual(coverage_of(op)["pytorch_fallback"], 0, op)

    def test_the_loss_with_ignored_targets_and_its_gradient_agree(self):
        g = torch.Generator().manual_seed(9)
        logits = torch.randn(12, 7, generator=g)
        targets = torch.randint(0, 7, (12,), generator=g)
        targets[[2, 5]] = -100  # ignored
        for reduction in ("mean", "sum"):
            a = logits.clone().requires_grad_()
            expected = torch.nn.functional.cross_entropy(a, targets, reduction=reduction)
            expected.backward()
            for device in loom_devices():
                loom_torch.device.reset_coverage()
                with self.subTest(device=device, reduction=reduction):
                    b = logits.to(device).requires_grad_()
                    got = torch.nn.functional.cross_entropy(b, targets.to(device), reduction=reduction)
                    got.backward()
                    self.assertLess(abs(got.item() - expected.item()) / abs(expected.item()), 1e-6)
                    diff = (b.grad.cpu() - a.grad).abs().max() / a.grad.abs().max()
                    self.assertLess(diff.item(), 1e-6)
                    for op in ("nll_loss_forward.output", "nll_loss_backward.grad_input"):
                        self.assertEqual(coverage_of(op)["pytorch_fallback"], 0, op)

    def test_an_unmapped_op_runs_on_pytorchs_cpu_kernels_and_is_counted(self):
        t = torch.linspace(-1, 1, 9)
        x = t.to("loom")
        self.assertTrue(torch.equal(torch.sin(x).cpu(), torch.sin(t)))
        record = coverage_of("sin.out")
        self.assertIsNotNone(record, [c["op"] for c in loom_torch.coverage()])
        self.assertEqual(record["pytorch_fallback"], record["calls"])
        self.assertGreater(record["bytes_copied"], 0)

    def test_tensors_on_two_loom_devices_are_an_error_naming_both(self):
        if len(loom_devices()) < 2:
            self.skipTest("one loom device in this build")
        a, b = torch.ones(3).to("loom:0"), torch.ones(3).to("loom:1")
        with self.assertRaises(RuntimeError) as caught:
            a + b
        message = str(caught.exception)
        self.assertIn("loom:0", message)
        self.assertIn("loom:1", message)

    def test_fallback_error_names_the_op(self):
        script = ("import torch, loom_torch\n"
                  "torch.sin(torch.ones(3).to('loom'))\n")
        env = dict(os.environ, LOOM_TORCH_FALLBACK="error")
        run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
        self.assertNotEqual(run.returncode, 0)
        self.assertIn("aten::sin", run.stderr)
        self.assertIn("Float", run.stderr)
        self.assertIn("LOOM_TORCH_FALLBACK=error", run.stderr)


if __name__ == "__main__":
    unittest.main()
