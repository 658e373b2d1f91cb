#!/usr/bin/env python3
"""PyTorch's results for the ops whose CPU kernel is Loom's reference kernel itself.

For cast, expand, concat, sqrt, erf, max, max_backward, avg_pool2d and avg_pool2d_backward
the CPU backend runs the reference kernel (src/core/reference_*.cpp), so the conformance
suite compares the oracle with itself. These fixtures give an independent oracle: PyTorch,
on small fixed-seed inputs chosen for the edges (odd sizes, size-1 and size-0 dims, negative
values, ties, signed zeros, infinities, NaN, rounding ties between dtypes). The test
tests/core/test_reference_fixtures.cpp runs each reference kernel on them.

    py=$(scripts/python-env --print)      # the pinned environment (scripts/python-requirements.txt)
    "$py" tools/make_reference_fixtures.py [OUT_DIR]   # default tests/fixtures/reference

Outputs: OUT_DIR/<op>.json, one per op:
    {"op", "generator", "torch", "numpy", "python", "seed", "expected_from", "cases": [
        {"name", "attrs": {...loom::Attrs fields...}, "inputs": [T...], "outputs": [T...],
         "torch_f32_max_ulp"?, "known_issue"?}]}
    T = {"dtype": "f32"|"bf16"|"f16"|"i32", "shape": [...], "data": [...]} in row-major order;
    f32 values are the shortest decimals that read back (through a double) to the same
    float, with "nan", "inf", "-inf" as strings; bf16 and f16 are raw bit patterns (uint16).
Exact ops (cast, expand, concat, max, max_backward) hold PyTorch's float32 results. sqrt,
erf and the pools hold the float64 result on the same (float32) inputs, rounded to float32:
the ground truth; "torch_f32_max_ulp" says how far PyTorch's own float32 kernel is from it.
"known_issue" marks a case where Loom's reference is known to disagree with PyTorch: the
test reports it and fails once the two agree (so the mark is removed when it is fixed).
"""
import json
import math
import os
import platform
import sys

import numpy as np
import torch

SEED = 20260523
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOOM_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.int32: "i32"}
TORCH_DTYPES = {v: k for k, v in LOOM_DTYPES.items()}


# ---- encoding ------------------------------------------------------------------------

def f32_number(v):
    """A float32 value as a JSON value: the shortest decimal that reads back exactly."""
    f = np.float32(v)
    if math.isnan(f):
        return "nan"
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    short = float(str(f))  # numpy's shortest round-trip repr of the float32
    if np.float32(short).view(np.uint32) != f.view(np.uint32):
        short = float(f)  # exact as a double: always reads back
    return short


def encode(t):
    t = t.detach().contiguous().cpu()
    dtype = LOOM_DTYPES[t.dtype]
    flat = t.reshape(-1)
    if dtype == "f32":
        data = [f32_number(v) for v in flat.numpy()]
    elif dtype == "i32":
        data = [int(v) for v in flat.numpy()]
    else:  # bf16, f16: the bits
        data = [int(v) & 0xFFFF for v in flat.view(torch.int16).numpy()]
    return {"dtype": dtype, "shape": list(t.shape), "data": data}


def from_bits(bits, dtype):
    """A bf16/f16 tensor from uint16 bit patterns."""
    return torch.tensor([b - 0x10000 if b >= 0x8000 else b for b in bits],
                        dtype=torch.int16).view(dtype)


def f32(values):
    return torch.tensor(values, dtype=torch.float32)


def ulp_distance(a, b):
    """Largest distance in float32 ulps between two float32 tensors (NaN == NaN)."""
    a = a.detach().float().reshape(-1).numpy()
    b = b.detach().float().reshape(-1).numpy()
    worst = 0
    for x, y in zip(a, b):
        if math.isnan(x) and math.isnan(y):
            continue
        if math.isnan(x) or math.isnan(y):
            return float("inf")

        def ordered(v):
            i = int(np.float32(v).view(np.int32))
            return i if i >= 0 else -(i & 0x7FFFFFFF)
        worst = max(worst, abs(ordered(x) - ordered(y)))
    return worst


class Fixture:
    def __init__(self, op, seed, expected_from):
        self.op, self.seed, self.expected_from = op, seed, expected_from
        self.gen = torch.Generator().manual_seed(seed)
        self.cases = []

    def randn(self, *shape, scale=1.0):
        return torch.randn(tuple(shape), generator=self.gen, dtype=torch.float32) * scale

    def randint(self, lo, hi, *shape):
        return torch.randint(lo, hi, shape, generator=self.gen, dtype=torch.int64)

    def add(self, name, inputs, outputs, attrs=None, known_issue=None, torch_f32=None):
        case = {"name": name, "attrs": attrs or {}, "inputs": [encode(t) for t in inputs],
                "outputs": [encode(t) for t in outputs]}
        if torch_f32 is not None:  # PyTorch's float32 kernel against the float64 truth
            case["torch_f32_max_ulp"] = max(ulp_distance(a, b) for a, b in zip(torch_f32, outputs))
        if known_issue:
            case["known_issue"] = known_issue
        assert all(c["name"] != name for c in self.cases), name
        self.cases.append(case)

    def write(self, out_dir):
        head = {"op": self.op, "generator": "tools/make_reference_fixtures.py",
                "torch": torch.__version__, "numpy": np.__version__,
                "python": platform.python_version(), "seed": self.seed,
                "expected_from": self.expected_from}
        lines = ["{"]
        for k, v in head.items():
            lines.append(f" {json.dumps(k)}: {json.dumps(v)},")
        lines.append(' "cases": [')
        body = [" " + json.dumps(c, separators=(",", ":"), allow_nan=False) for c in self.cases]
        lines.append(",\n".join(body))
        lines.append(" ]")
        lines.append("}")
        path = os.path.join(out_dir, f"{self.op}.json")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        json.load(open(path))  # it parses
        return path, len(self.cases), os.path.getsize(path)


def f64_truth(fn, *inputs):
    """fn on the float32 inputs widened to float64, rounded to float32; and fn in float32."""
    truth = fn(*[t.double() for t in inputs]).float()
    return truth, fn(*inputs)


# ---- cast --------------------------------------------------------------------------------

F32_SPECIALS = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.7, -0.7, 3.999, -3.999,
                1e-3, 65504.0, 65519.996, 65520.0, -65520.0, 1e5, -1e5,
                5.960464477539063e-08, 2.9802322387695312e-08, 2.99e-08, 1e-8,  # f16 subnormal edge
                6.103515625e-05, 6.0e-05,  # f16 smallest normal, a subnormal
                1.00390625, 1.01171875, 1.0039063, -1.00390625,  # bf16 rounding ties and near-ties
                3.3895314e38, 3.4028235e38, 1e-40, -1e-45, 1.1754944e-38,
                16777217.0, 2147483520.0, -2147483648.0, 123456.79, -7.9999995]
F32_NONFINITE = [float("inf"), float("-inf"), float("nan")]
I32_SMALL = [0, 1, -1, 7, -7, 255, 256, 257, 259, -257, 1000, 2049, 4097, 65504, 65519, 65520,
             -65520, 65535, 100000, 16777216, -16777216, 16777215]
I32_LARGE = [16777217, 16777219, 2**25 + 2**17 + 1, 2147483647, -2147483648,
             -123456789, 2**31 - 129, 1000000007, 2**24 + 2**16 + 1]
BF16_BITS = [0x0000, 0x8000, 0x3F80, 0xBF80, 0x4020, 0xC020, 0x3F40, 0xBF40, 0x0001, 0x8001,
             0x0080, 0x3380, 0x3300, 0x477F, 0x4780, 0xC780, 0x4B80, 0x4F00, 0xCF00, 0x3F81,
             0x3F83, 0x7F7F, 0x387F, 0x4000]
BF16_NONFINITE = [0x7F80, 0xFF80, 0x7FC0, 0xFFC0]
F16_BITS = [0x0000, 0x8000, 0x3C00, 0xBC00, 0x4100, 0xC100, 0x3A00, 0xBA00, 0x0001, 0x8001,
            0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x3C01, 0x3C02, 0x3C03, 0x3C05, 0x5BFF, 0x6400,
            0x3555, 0x0200]
F16_NONFINITE = [0x7C00, 0xFC00, 0x7E00, 0xFE00]


def cast_cases(fx):
    # i32 -> float stays in range for every value; float -> i32 only where C++ defines it
    # (finite, |x| < 2^31: PyTorch and C++ both truncate toward zero there).
    in_range = lambda t: t.float().isfinite() & (t.float().abs() < 2.0**31)
    sources = {
        "f32": torch.cat([f32(F32_SPECIALS), f32(F32_NONFINITE), fx.randn(24, scale=50.0)]),
        "bf16": torch.cat([from_bits(BF16_BITS + BF16_NONFINITE, torch.bfloat16),
                           fx.randn(12, scale=300.0).bfloat16()]),
        "f16": torch.cat([from_bits(F16_BITS + F16_NONFINITE, torch.float16),
                          fx.randn(12, scale=300.0).half()]),
        "i32": torch.cat([torch.tensor(I32_SMALL + I32_LARGE, dtype=torch.int32),
                          fx.randint(-2**31, 2**31, 12).to(torch.int32)]),
    }
    for src, x in sources.items():
        for dst in ("f32", "bf16", "f16", "i32"):
            v = x
            if dst == "i32" and src != "i32":
                v = x[in_range(x)]
            if src == "i32" and dst == "i32":
                v = torch.tensor(I32_SMALL, dtype=torch.int32)
            y = v.to(TORCH_DTYPES[dst])
            fx.add(f"{src}_to_{dst}", [v], [y], {"dtype": dst})
    # An i32 -> i32 cast is the identity, beyond float's 24 bits too.
    big = torch.tensor(I32_LARGE, dtype=torch.int32)
    fx.add("i32_to_i32_large", [big], [big.clone()], {"dtype": "i32"})
    # Shapes: size-1 dims, rank 3, a scalar, an empty tensor.
    x = fx.randn(2, 1, 3, scale=10.0)
    fx.add("f32_to_i32_rank3", [x], [x.to(torch.int32)], {"dtype": "i32"})
    x = fx.randn(1, 5, 1, scale=1000.0)
    fx.add("f32_to_bf16_size1_dims", [x], [x.bfloat16()], {"dtype": "bf16"})
    x = f32(-2.75).reshape([])
    fx.add("f32_to_i32_scalar", [x], [x.to(torch.int32)], {"dtype": "i32"})
    x = torch.zeros(3, 0)
    fx.add("f32_to_f16_empty", [x], [x.half()], {"dtype": "f16"})


# ---- expand, concat -----------------------------------------------------------------------------

def expand_cases(fx):
    for name, shape, target in [
        ("column", [3, 1], [3, 4]), ("row", [1, 5], [4, 5]), ("leading_dims", [2, 1, 3], [4, 2, 5, 3]),
        ("vector_to_rank3", [7], [2, 3, 7]), ("one_to_rank3", [1], [2, 3, 5]),
        ("scalar", [], [3, 2]), ("identity", [2, 3], [2, 3]), ("ones", [1, 1], [1, 1, 1]),
        ("middle", [5, 1, 7], [5, 3, 7]), ("both_ends", [1, 4, 1], [3, 4, 2]),
        ("to_empty", [1, 3], [0, 3])]:
        x = fx.randn(*shape)
        fx.add(name, [x], [x.expand(target)], {"shape": target})


def concat_cases(fx):
    def case(name, shapes, axis, dtype=torch.float32):
        xs = [fx.randn(*s, scale=3.0) for s in shapes]
        if dtype == torch.int32:
            xs = [fx.randint(-1000, 1000, *s).to(torch.int32) for s in shapes]
        elif dtype != torch.float32:
            xs = [x.to(dtype) for x in xs]
        fx.add(name, xs, [torch.cat(xs, dim=axis)], {"axis": axis})

    case("axis0", [[2, 3], [3, 3]], 0)
    case("axis1_three", [[2, 1, 4], [2, 3, 4], [2, 2, 4]], 1)
    case("axis_minus1", [[3, 2], [3, 5]], -1)
    case("last_axis_rank3", [[2, 3, 1], [2, 3, 4]], 2)
    case("single", [[3, 5]], 0)
    case("size1_pieces", [[1, 1], [1, 1], [1, 1]], 0)
    case("empty_piece", [[2, 2, 3], [2, 0, 3], [2, 1, 3]], 1)
    case("rank1", [[5], [1], [3]], 0)
    case("rank4_axis2", [[1, 2, 3, 2], [1, 2, 1, 2], [1, 2, 2, 2], [1, 2, 1, 2]], 2)
    case("axis_minus3_rank3", [[1, 2, 3], [2, 2, 3]], -3)
    case("i32_axis0", [[2, 3], [1, 3]], 0, torch.int32)
    case("bf16_axis_minus2", [[2, 3, 2], [2, 1, 2]], -2, torch.bfloat16)
    case("f16_axis1", [[3, 1], [3, 2]], 1, torch.float16)


# ---- sqrt, erf -------------------------------------------------------------------------------------

def unary_cases(fx, fn):
    def case(name, x):
        truth, torch32 = f64_truth(fn, x)
        fx.add(name, [x], [truth], torch_f32=[torch32])

    if fn is torch.sqrt:
        mag = torch.pow(10.0, fx.randn(37) * 3.0)
        case("positive_wide_range", mag.float())
        case("unit_range_rank3", fx.randn(3, 1, 5).abs())
        case("specials", f32([0.0, -0.0, 1.0, 4.0, 2.0, 0.25, 9.0, 1e-45, 1e-40, 1.1754944e-38,
                              3.4028235e38, 1e-30, 16777215.0, float("inf"), 0.1, 3.0]))
        case("negative_is_nan", f32([-1.0, -1e-30, -1e-45, float("-inf"), float("nan"), -0.0, -4.0]))
        case("perfect_squares", torch.arange(0, 50, dtype=torch.float32).square().reshape(5, 10))
        case("size1", fx.randn(1, 1).abs())
    else:
        case("normal", fx.randn(41, scale=1.5))
        case("grid", torch.linspace(-6.0, 6.0, 49, dtype=torch.float32).reshape(7, 7))
        case("tiny", f32([0.0, -0.0, 1e-45, -1e-45, 1e-40, 1e-30, -1e-20, 1e-8, 1e-4, -3e-3]))
        case("large_and_nonfinite", f32([3.5, 3.9, 3.92, 4.0, 10.0, -10.0, 1e30, -1e30,
                                         float("inf"), float("-inf"), float("nan")]))
        case("odd_rank3", fx.randn(3, 1, 7, scale=0.7))


# ---- max, max_backward ----------------------------------------------------------------------------------

def max_inputs(fx):
    """(name, x, axis, keepdim, known_issue) for max and max_backward."""
    ties = fx.randint(-3, 3, 6, 8).float()
    zeros = f32([[0.0, -0.0, -1.0], [-0.0, 0.0, -1.0], [-1.0, -0.0, 0.0]])
    inf = f32([[float("-inf"), float("-inf"), float("-inf")], [1.0, float("inf"), float("inf")],
               [float("-inf"), -3.0, float("-inf")]])
    nan = f32([[1.0, float("nan"), 3.0], [float("nan"), -1.0, 5.0], [2.0, 2.0, float("nan")]])
    return [
        ("rows", fx.randn(5, 6), 1, False, None),
        ("cols_keepdim", fx.randn(5, 6), 0, True, None),
        ("rank3_last", fx.randn(3, 4, 5), -1, False, None),
        ("rank3_middle_keepdim", fx.randn(3, 4, 5), 1, True, None),
        ("rank3_first_negative_axis", fx.randn(3, 4, 5), -3, False, None),
        ("vector_to_scalar", fx.randn(7), 0, False, None),
        ("vector_keepdim", fx.randn(7), 0, True, None),
        ("length1_axis", fx.randn(1, 4), 0, False, None),
        ("length1_axis_keepdim", fx.randn(4, 1), 1, True, None),
        ("odd_rank4", fx.randn(2, 3, 5, 1), 2, False, None),
        ("ties_rows", ties, 1, False, None),
        ("ties_cols_keepdim", ties, 0, True, None),
        ("all_equal", torch.full((3, 4), -2.5), 1, False, None),
        ("all_negative", -fx.randn(3, 5).abs() - 1.0, 1, False, None),
        ("signed_zeros", zeros, 1, False, None),
        ("infinities", inf, 1, False, None),
        ("nan", nan, 1, False, None),  # the maximum is NaN; its gradient goes to the first NaN
    ]


def max_cases(fx):
    for name, x, axis, keepdim, issue in max_inputs(fx):
        y = torch.max(x, dim=axis, keepdim=keepdim).values
        fx.add(name, [x], [y], {"axis": axis, "keepdim": keepdim}, known_issue=issue)


def max_backward_cases(fx):
    for name, x, axis, keepdim, issue in max_inputs(fx):
        xg = x.clone().requires_grad_(True)
        y = torch.max(xg, dim=axis, keepdim=keepdim).values
        dy = fx.randn(*y.shape) + 2.0  # nonzero, so a misplaced gradient shows
        y.backward(dy)
        fx.add(name, [dy, x, y.detach()], [xg.grad], {"axis": axis, "keepdim": keepdim},
               known_issue=issue)


# ---- avg_pool2d, avg_pool2d_backward --------------------------------------------------------------

POOL_CASES = [  # name, [N,C,H,W], kernel, stride
    ("k2s2_even", [1, 1, 4, 4], 2, 2),
    ("k3s2_odd_floor", [2, 3, 7, 5], 3, 2),
    ("k2s1_overlap", [1, 2, 5, 5], 2, 1),
    ("k2s3_gaps", [2, 1, 6, 7], 2, 3),
    ("k1s1_identity", [1, 1, 1, 1], 1, 1),
    ("k3s1_global", [1, 2, 3, 3], 3, 1),
    ("k4s4_wide", [3, 1, 9, 4], 4, 4),
    ("k1s2_subsample", [1, 1, 8, 7], 1, 2),
    ("k3s3_rect", [2, 2, 5, 6], 3, 3),
    ("k3s1_overlap_odd", [1, 1, 6, 5], 3, 1),
    ("k5s2_large_kernel", [1, 1, 9, 11], 5, 2),
]


def avg_pool_cases(fx, backward):
    pool = lambda t, k, s: torch.nn.functional.avg_pool2d(t, k, s)
    for name, shape, k, s in POOL_CASES:
        x = fx.randn(*shape, scale=2.0)
        attrs = {"kernel": k, "stride": s}
        if not backward:
            truth, torch32 = f64_truth(lambda t: pool(t, k, s), x)
            fx.add(name, [x], [truth], attrs, torch_f32=[torch32])
            continue
        dy = fx.randn(*pool(x, k, s).shape, scale=2.0)

        def grad(xx, dd):
            xx = xx.clone().requires_grad_(True)
            pool(xx, k, s).backward(dd)
            return xx.grad
        truth, torch32 = f64_truth(grad, x, dy)
        fx.add(name, [dy], [truth], dict(attrs, shape=shape), torch_f32=[torch32])
    # Mixed magnitudes: cancellation within a window.
    x = fx.randn(1, 1, 6, 6) * torch.pow(10.0, fx.randint(-4, 5, 1, 1, 6, 6).float())
    if not backward:
        truth, torch32 = f64_truth(lambda t: pool(t, 2, 1), x)
        fx.add("mixed_magnitudes", [x], [truth], {"kernel": 2, "stride": 1}, torch_f32=[torch32])
    else:
        dy = fx.randn(1, 1, 5, 5) * torch.pow(10.0, fx.randint(-4, 5, 1, 1, 5, 5).float())

        def grad(xx, dd):
            xx = xx.clone().requires_grad_(True)
            pool(xx, 2, 1).backward(dd)
            return xx.grad
        truth, torch32 = f64_truth(grad, x, dy)
        fx.add("mixed_magnitudes", [dy], [truth], {"kernel": 2, "stride": 1, "shape": [1, 1, 6, 6]},
               torch_f32=[torch32])


# ---- main -------------------------------------------------------------------------------------------

# ---- top_k, top_k_backward ----------------------------------------------------------------------

TOP_K_CASES = [  # name, shape, k: router scores, one row per token, experts on the last axis
    ("tokens_8_experts_top2", [5, 8], 2),
    ("tokens_64_experts_top6", [4, 64], 6),
    ("batched_rank3", [2, 3, 16], 4),
    ("k_is_the_row", [3, 5], 5),
    ("k_1", [7, 12], 1),
]


def top_k_cases(fx, backward):
    """torch.topk along the last axis (sorted); rows of distinct values: PyTorch does not say
    which of two equal values it returns first (Loom's rule, the lower index, is the
    conformance suite's)."""
    for name, shape, k in TOP_K_CASES:
        x = fx.randn(*shape)
        values, indices = torch.topk(x, k, dim=-1)
        indices = indices.to(torch.int32)
        if not backward:
            fx.add(name, [x], [values, indices], {"k": k})
            continue
        xg = x.clone().requires_grad_(True)
        dv = fx.randn(*values.shape) + 2.0
        torch.topk(xg, k, dim=-1).values.backward(dv)
        fx.add(name, [dv, indices], [xg.grad], {"shape": shape})


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "fixtures", "reference")
    os.makedirs(out_dir, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    ops = [
        ("cast", "torch float32/bfloat16/float16/int32 Tensor.to", cast_cases),
        ("expand", "torch Tensor.expand", expand_cases),
        ("concat", "torch.cat", concat_cases),
        ("sqrt", "torch.sqrt in float64, rounded to float32", lambda fx: unary_cases(fx, torch.sqrt)),
        ("erf", "torch.erf in float64, rounded to float32", lambda fx: unary_cases(fx, torch.erf)),
        ("max", "torch.max(x, dim, keepdim).values", max_cases),
        ("max_backward", "torch autograd of torch.max(x, dim, keepdim).values", max_backward_cases),
        ("avg_pool2d", "torch.nn.functional.avg_pool2d in float64, rounded to float32",
         lambda fx: avg_pool_cases(fx, False)),
        ("avg_pool2d_backward", "torch autograd of avg_pool2d in float64, rounded to float32",
         lambda fx: avg_pool_cases(fx, True)),
        ("top_k", "torch.topk(x, k, dim=-1), indices as int32", lambda fx: top_k_cases(fx, False)),
        ("top_k_backward", "torch autograd of torch.topk(x, k, dim=-1).values",
         lambda fx: top_k_cases(fx, True)),
    ]
    total = 0
    for i, (op, source, make) in enumerate(ops):
        fx = Fixture(op, SEED + i, source)
        make(fx)
        path, n, size = fx.write(out_dir)
        total += size
        print(f"{os.path.relpath(path, ROOT)}: {n} cases, {size} bytes")
    print(f"torch {torch.__version__}: {total} bytes in all")


if __name__ == "__main__":
    main()
