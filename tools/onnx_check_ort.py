#!/usr/bin/env python3
"""Run ONNX models through ONNX Runtime and through Loom, and report the largest
difference per output, or the first operator that keeps a model from importing.

Run with the repository's pinned environment (scripts/python-env):
    $(scripts/python-env --print) tools/onnx_check_ort.py [options] PATH [PATH ...]

PATH is an .onnx file or a folder; a folder is searched (not recursively) for *.onnx files
and for backend-test folders (*/model.onnx). A model's inputs are taken from
<model without .onnx>/test_data_set_0/input_N.pb (or <folder>/test_data_set_0/ for a
backend-test folder, or <model without .onnx>/input_N.pb) where they exist, and drawn at random from the declared types and
shapes otherwise (token ids in [0, --int-high)).

The criterion is the one the ONNX import is held to:
    max |Loom - ONNX Runtime|  <=  --tolerance x max(1, max |ONNX Runtime|)   (per output)

Options:
  --loom PATH           the loom binary (default build/release/loom)
  --devices LIST        comma-separated Loom backends (default cpu)
  --write-reference     write ONNX Runtime's outputs as test_data_set_0/output_N.pb (and the
                        inputs used as input_N.pb), so tests can check without ONNX Runtime
  --upgrade-below N     models whose default-domain opset is below N are first upgraded to
                        opset N with onnx.version_converter (default 7; 0 turns it off)
  --tolerance T         default 1e-4
  --json FILE           write the results as JSON
Exit status: 0 when every model imports and is within tolerance on every device, else 1.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime
from onnx import numpy_helper, version_converter


def default_opset(model):
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


def find_models(paths):
    """(model file, folder holding test_data_set_0 or None) for each model under paths."""
    found = []
    for path in paths:
        if os.path.isfile(path):
            found.append(path)
            continue
        if not os.path.isdir(path):
            sys.exit(f"onnx_check_ort: {path}: no such file or folder")
        found += sorted(glob.glob(os.path.join(path, "*.onnx")))
        found += sorted(glob.glob(os.path.join(path, "*", "model.onnx")))
    if not found:
        sys.exit(f"onnx_check_ort: no .onnx models under {' '.join(paths)}")
    return [(m, data_folder(m)) for m in found]


def data_folder(model_path):
    """Where a model's example inputs are: <folder>/test_data_set_0 for a backend-test
    folder; <stem>/test_data_set_0, or <stem>/ itself where it holds input_0.pb."""
    if os.path.basename(model_path) == "model.onnx":
        return os.path.join(os.path.dirname(model_path), "test_data_set_0")
    stem = model_path[: -len(".onnx")]
    if os.path.exists(os.path.join(stem, "input_0.pb")):
        return stem
    return os.path.join(stem, "test_data_set_0")


NUMPY_OF_ONNX = {
    onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.DOUBLE: np.float64,
    onnx.TensorProto.INT64: np.int64, onnx.TensorProto.INT32: np.int32,
    onnx.TensorProto.BOOL: np.bool_, onnx.TensorProto.FLOAT16: np.float16,
}


def graph_inputs(model):
    initialised = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in initialised]


def make_inputs(model, folder, rng, int_high):
    """The model's inputs: from folder's input_N.pb where present, else random."""
    inputs = []
    for k, value in enumerate(graph_inputs(model)):
        path = os.path.join(folder, f"input_{k}.pb")
        if os.path.exists(path):
            t = onnx.TensorProto()
            with open(path, "rb") as f:
                t.ParseFromString(f.read())
            inputs.append(numpy_helper.to_array(t))
            continue
        tt = value.type.tensor_type
        dims = [d.dim_value for d in tt.shape.dim]
        if any(d <= 0 for d in dims):
            sys.exit(f"onnx_check_ort: {value.name}: shape {dims} is not static; give "
                     f"{path}")
        dtype = NUMPY_OF_ONNX.get(tt.elem_type)
        if dtype is None:
            sys.exit(f"onnx_check_ort: {value.name}: element type {tt.elem_type} has no "
                     f"random generator here; give {path}")
        if np.issubdtype(dtype, np.integer):
            inputs.append(rng.integers(0, int_high, size=dims).astype(dtype))
        elif dtype == np.bool_:
            inputs.append(rng.integers(0, 2, size=dims).astype(np.bool_))
        else:
            inputs.append(rng.standard_normal(dims).astype(dtype))
    return inputs


def save_pb(array, path):
    with open(path, "wb") as f:
        f.write(numpy_helper.from_array(np.ascontiguousarray(array)).SerializeToString())


def first_blocking_op(model, unsupported):
    """The first node, in graph order and through subgraphs, whose op Loom lacks."""
    def walk(graph):
        for node in graph.node:
            if node.op_type in unsupported:
                return f"{node.op_type} (node '{node.name}')"
            for attr in node.attribute:
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    found = walk(sub)
                    if found:
                        return found
        return None
    return walk(model.graph)


def run_loom(loom, model_path, device, input_files, expect_files):
    cmd = [loom, "onnx", model_path, "--device", device, "--json"]
    for f in input_files:
        cmd += ["--input", f]
    for f in expect_files:
        cmd += ["--expect", f]
    done = subprocess.run(cmd, capture_output=True, text=True)
    lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
    if not lines:
        return None, (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}")
    return json.loads(lines[-1]), done.stderr.strip()


def check_model(args, model_path, folder, rng):
    result = {"model": model_path}
    model = onnx.load(model_path)
    opset = default_opset(model)
    result["opset"] = opset
    tmp = tempfile.mkdtemp(prefix="onnx_check_ort.")
    try:
        return check_in(args, model_path, folder, rng, result, model, opset, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_in(args, model_path, folder, rng, result, model, opset, tmp):
    run_path = model_path
    if args.upgrade_below and opset < args.upgrade_below:
        model = version_converter.convert_version(model, args.upgrade_below)
        run_path = os.path.join(tmp, "upgraded.onnx")
        onnx.save(model, run_path)
        result["upgraded_to"] = args.upgrade_below
    inputs = make_inputs(model, folder, rng, args.int_high)
    session = onnxruntime.InferenceSession(run_path, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    reference = session.run(None, dict(zip(names, inputs)))
    where = folder if args.write_reference else tmp
    os.makedirs(where, exist_ok=True)
    input_files, expect_files = [], []
    for k, x in enumerate(inputs):
        input_files.append(os.path.join(where, f"input_{k}.pb"))
        if args.write_reference or not os.path.exists(input_files[-1]):
            save_pb(x, input_files[-1])
    for k, y in enumerate(reference):
        expect_files.append(os.path.join(where, f"output_{k}.pb"))
        save_pb(y, expect_files[-1])
    result["devices"] = {}
    for device in args.devices:
        # The op report first (no inputs: nothing runs), so a model that does not import
        # names its first blocking operator instead of failing at it.
        report, detail = run_loom(args.loom, run_path, device, [], [])
        unsupported = {o["op"] for o in (report or {}).get("ops", []) if not o["supported"]}
        if unsupported:
            result["devices"][device] = {"status": "op not imported",
                                         "first_blocking_op": first_blocking_op(model, unsupported),
                                         "ops_not_imported": sorted(unsupported)}
            continue
        if report is not None:
            report, detail = run_loom(args.loom, run_path, device, input_files, expect_files)
        if report is None:
            result["devices"][device] = {"status": "error", "detail": detail}
            continue
        outputs = []
        ok = True
        for k, out in enumerate(report.get("outputs", [])):
            scale = max(1.0, float(np.max(np.abs(reference[k]))) if reference[k].size else 1.0)
            diff = out["max_abs_error"]
            diff = float("inf") if diff is None else diff  # JSON has no infinity: null
            ratio = diff / scale
            outputs.append({"output": out["output"], "max_abs_difference": diff,
                            "max_abs_reference": scale, "relative_to_scale": ratio})
            ok = ok and ratio <= args.tolerance
        if len(outputs) != len(reference):
            ok = False
        result["devices"][device] = {"status": "pass" if ok else "fail", "outputs": outputs}
        if not ok and detail:
            result["devices"][device]["detail"] = detail
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    p.add_argument("paths", nargs="+")
    p.add_argument("--loom", default="build/release/loom")
    p.add_argument("--devices", default="cpu")
    p.add_argument("--write-reference", action="store_true")
    p.add_argument("--upgrade-below", type=int, default=7)
    p.add_argument("--tolerance", type=float, default=1e-4)
    p.add_argument("--int-high", type=int, default=10)
    p.add_argument("--json")
    args = p.parse_args()
    args.devices = [d for d in args.devices.split(",") if d]
    if not os.path.exists(args.loom):
        sys.exit(f"onnx_check_ort: no loom binary at {args.loom} (build it, or give --loom)")
    rng = np.random.default_rng(0)
    results = [check_model(args, m, f, rng) for m, f in find_models(args.paths)]
    failed = 0
    print(f"ONNX Runtime {onnxruntime.__version__}, onnx {onnx.__version__}; criterion "
          f"max|Loom - ORT| <= {args.tolerance:g} x max(1, max|ORT|)")
    print(f"| model | opset | device | status | max abs difference | / scale |")
    print(f"| --- | ---: | --- | --- | ---: | ---: |")
    for r in results:
        name = os.path.relpath(r["model"])
        for device, d in r["devices"].items():
            failed += d["status"] != "pass"
            if d["status"] in ("pass", "fail"):
                worst = max(d["outputs"], key=lambda o: o["relative_to_scale"], default=None)
                diff = f"{worst['max_abs_difference']:.3g}" if worst else "-"
                rel = f"{worst['relative_to_scale']:.3g}" if worst else "-"
                print(f"| {name} | {r['opset']} | {device} | {d['status']} | {diff} | {rel} |")
            else:
                why = d.get("first_blocking_op") or d.get("detail", "")
                print(f"| {name} | {r['opset']} | {device} | {d['status']}: {why} | - | - |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__,
                       "tolerance": args.tolerance, "models": results}, f, indent=1)
            f.write("\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
