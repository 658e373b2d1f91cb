#!/usr/bin/env python3
"""Runs the official ONNX backend node tests through `loom onnx --conformance` on each
backend, writes the report of every test not passed with its reason, and refreshes the
repository's copy of the passing set (the test suite runs that copy on every backend).

The node tests ship in onnx's source distribution; `bench/onnx_conformance` fetches
onnx 1.22.0's from PyPI (checked by its sha256) into build/bench/, which is this script's
default --node. Then:

    tools/onnx_conformance.py --devices cpu,partial,opencl \
        --report docs/onnx-conformance.md --fixtures tests/fixtures/onnx/node

The cuda backend runs here through its emulator: add `cuda` to --devices and set
LOOM_CUDA_EMULATOR=1. The script fails when the backends pass different sets.
"""
import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys


def run(loom, node, device):
    out = subprocess.run([loom, "onnx", "--conformance", node, "--device", device, "--json"],
                         capture_output=True, text=True)
    if not out.stdout.strip():
        sys.exit(f"loom onnx --conformance on {device} printed nothing: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def reason(result, node):
    """The detail without the machine's paths (the test folder is named by the row)."""
    detail = result["detail"].replace(node.rstrip("/") + "/", "")
    detail = re.sub(r"^test_[A-Za-z0-9_]+/(model\.onnx|test_data_set_0/\w+\.pb): ?", "", detail)
    return detail.replace("|", "\\|")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--node", default="build/bench/onnx-1.22.0/onnx-1.22.0/onnx/backend/test/data/node",
                   help="the node tests (default: where bench/onnx_conformance puts them)")
    p.add_argument("--loom", default="build/release/loom")
    p.add_argument("--devices", default="cpu,partial,opencl")
    p.add_argument("--report", help="the Markdown report to write")
    p.add_argument("--fixtures", help="folder to refresh with the passing tests")
    p.add_argument("--version", default="1.22.0", help="the onnx version of --node, for the report")
    args = p.parse_args()

    results = {d: run(args.loom, args.node, d) for d in args.devices.split(",")}
    passing = {d: {r["test"] for r in j["results"] if r["status"] == "pass"} for d, j in results.items()}
    first = next(iter(results))
    for d, s in passing.items():
        if s != passing[first]:
            sys.exit(f"{d} passes a different set than {first}: "
                     f"only {d}: {sorted(s - passing[first])[:10]}, only {first}: {sorted(passing[first] - s)[:10]}")
    for d, j in results.items():
        print(f"{d}: {j['tests']} tests, {j['pass']} pass, {j['fail']} fail, {j['error']} error, "
              f"{j['unsupported']} op not imported, {j.get('random', 0)} random")

    if args.report:
        j = results[first]
        rows = [r for r in j["results"] if r["status"] != "pass"]
        by_op = collections.Counter()
        for r in rows:
            if r["status"] == "unsupported":
                by_op.update(r["detail"].split(", "))
        with open(args.report, "w") as f:
            f.write(f"# ONNX backend node tests: what Loom does not pass\n\n")
            f.write(f"Written by `tools/onnx_conformance.py` from onnx {args.version}'s "
                    f"{j['tests']} node tests. The backends {', '.join(results)} pass the same "
                    f"{j['pass']} ({100.0 * j['pass'] / j['tests']:.1f}%); the test suite runs "
                    f"those on every backend (`tests/fixtures/onnx/node`).\n\n")
            f.write("| backend | pass | fail | error | op not imported | random |\n| --- | ---: | ---: | ---: | ---: | ---: |\n")
            for d, r in results.items():
                f.write(f"| {d} | {r['pass']} | {r['fail']} | {r['error']} | {r['unsupported']} | {r.get('random', 0)} |\n")
            f.write("\nStatuses: **unsupported**, the test uses an operator Loom does not import "
                    "(all of them are named); **error**, Loom refused the model or its data with "
                    "the error shown; **fail**, an output differs from the expected one beyond "
                    "the ONNX runner's tolerance (rtol 1e-3, atol 1e-7); **random**, the expected "
                    "output was drawn from numpy's random generator, so no implementation can "
                    "match it (never counted as a pass).\n\n")
            f.write("Operators not imported, by the number of tests that use them:\n\n")
            f.write(", ".join(f"{op} ({n})" for op, n in by_op.most_common()) + "\n\n")
            f.write("| test | status | reason |\n| --- | --- | --- |\n")
            for r in rows:
                f.write(f"| {r['test']} | {r['status']} | {reason(r, args.node)} |\n")
        print(f"wrote {args.report}")

    if args.fixtures:
        keep = {"LICENSE"}
        for name in os.listdir(args.fixtures):
            if name not in keep:
                shutil.rmtree(os.path.join(args.fixtures, name))
        for test in sorted(passing[first]):
            src = os.path.join(args.node, test)
            dst = os.path.join(args.fixtures, test)
            os.makedirs(dst)
            shutil.copy2(os.path.join(src, "model.onnx"), dst)
            shutil.copytree(os.path.join(src, "test_data_set_0"), os.path.join(dst, "test_data_set_0"))
        print(f"copied {len(passing[first])} tests into {args.fixtures}")


if __name__ == "__main__":
    main()
