#!/usr/bin/python3
"""Fit the coefficients of the OpenCL backend's single-precision erf (loom_erf in
src/backends/opencl/elementwise.cl) and measure its error in float32.

Needs numpy and mpmath (Debian 12: apt-get install -y python3-numpy python3-mpmath; the
repository's .venv has both). Run: python3 tools/fit_erf.py

The function has two pieces, both evaluated in the kernel and one selected:
  |x| < T:  erf(x) = x * P(x^2), P(s) ~ erf(sqrt s) / sqrt s   (relative error fitted)
  |x| >= T: erf(x) = sign(x) * (1 - exp(Q(min(|x|, 4)))), Q(t) ~ log erfc(t)
            (absolute error fitted: the result's error is erfc(t) times Q's)
Each polynomial is a weighted least-squares fit on Chebyshev nodes, refined toward the
minimax one by Lawson's iteration (weights multiplied by the error at each node). The
coefficients are rounded to float32 and the whole function is evaluated as the kernel
does (Horner's rule with fma, rounded to float32 at each step) on a dense grid and on
tiny arguments; the largest error in float32 ulps of the exact erf (mpmath) is printed.
"""
import sys

import mpmath as mp
import numpy as np

mp.mp.dps = 40
SPLIT = 0.9
DEGREE_SMALL = 6
DEGREE_TAIL = 9
TAIL_END = 4.0  # erfc(4) = 1.5e-8, below half an ulp of 1


def f32(x):
    return np.float32(x)


def fma32(a, b, c):
    # A float32 product is exact in float64; the sum rounds once to float64, then float32.
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


def horner(coefficients, x):  # highest degree first
    r = f32(coefficients[0])
    for c in coefficients[1:]:
        r = fma32(r, x, f32(c))
    return r


def fit(fun, lo, hi, degree, relative, nodes=4000, rounds=60):
    k = np.arange(nodes)
    xs = (lo + hi) / 2 + (hi - lo) / 2 * np.cos(np.pi * (k + 0.5) / nodes)
    ys = np.array([float(fun(mp.mpf(float(x)))) for x in xs])
    weight = 1 / np.abs(ys) if relative else np.ones_like(ys)
    v = np.vander(xs, degree + 1)
    lawson = np.ones(nodes)
    for _ in range(rounds):
        w = weight * np.sqrt(lawson)
        c = np.linalg.lstsq(v * w[:, None], ys * w, rcond=None)[0]
        error = np.abs((v @ c - ys) * weight)
        lawson = lawson * error
        lawson /= lawson.sum()
    return c, float(np.max(np.abs((v @ c - ys) * weight)))


def small_piece(s):
    return mp.erf(mp.sqrt(s)) / mp.sqrt(s) if s > 0 else 2 / mp.sqrt(mp.pi)


def main():
    p, p_error = fit(small_piece, 0.0, SPLIT * SPLIT, DEGREE_SMALL, relative=True)
    q, q_error = fit(lambda t: mp.log(mp.erfc(t)), SPLIT, TAIL_END, DEGREE_TAIL, relative=False)
    p32 = [f32(c) for c in p]
    q32 = [f32(c) for c in q]

    def loom_erf(x):
        x = f32(x)
        a = abs(x)
        if a < SPLIT:
            return f32(x * horner(p32, f32(x * x)))
        tail = horner(q32, f32(min(a, TAIL_END)))
        return np.copysign(f32(1.0) - f32(np.exp(np.float64(tail))), x)

    grid = np.concatenate([np.linspace(-5, 5, 200001, dtype=np.float32),
                           np.float32(np.logspace(-30, 0, 2000))])
    worst, at = 0.0, None
    for x in grid:
        exact = mp.erf(mp.mpf(float(x)))
        rounded = f32(float(exact))
        ulp = float(np.spacing(abs(rounded))) if rounded != 0 else 1e-45
        error = abs(float(loom_erf(x)) - float(exact)) / ulp
        if error > worst:
            worst, at = error, float(x)
    print(f"fit error: P {p_error:.3g} (relative), Q {q_error:.3g} (absolute)")
    print(f"largest error over the grid: {worst:.2f} ulp at x = {at}")
    print("P (x^2, highest degree first):", ", ".join(float(c).hex() + "f" for c in p32))
    print("Q (t, highest degree first):  ", ", ".join(float(c).hex() + "f" for c in q32))
    return 0


if __name__ == "__main__":
    sys.exit(main())
