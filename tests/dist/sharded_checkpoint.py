"""Reads Loom's checkpoints in the tests, without Loom: a safetensors file's tensors, and a
sharded checkpoint's logical tensors assembled whole from the pieces its index lists
(src/train/sharded_checkpoint.h). Values are flat row-major arrays of float32."""
import json
import struct
from array import array


def safetensors(path):
    """{name: array('f')} of a safetensors file of F32 tensors."""
    return {name: values for name, (values, _) in _entries(path).items()}


def _entries(path):
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", (path, name, e["dtype"])
        a, b = e["data_offsets"]
        out[name] = (array("f", data[a:b]), e["shape"])
    return out


def _count(shape):
    n = 1
    for x in shape:
        n *= x
    return n


def logical(folder):
    """({name: array('f')}, metadata) of the sharded checkpoint in `folder`."""
    with open(f"{folder}/index.json") as f:
        index = json.load(f)
    files = [_entries(f"{folder}/{f['name']}") for f in index["files"]]
    out = {}
    for name, t in index["tensors"].items():
        shape = t["shape"]
        whole = array("f", bytes(4 * _count(shape)))
        strides = [1] * len(shape)
        for k in range(len(shape) - 2, -1, -1):
            strides[k] = strides[k + 1] * shape[k + 1]
        for p in t["pieces"]:
            values, pshape = files[p["file"]][name]
            start = p["start"]
            if not pshape:  # a scalar
                whole[0:1] = values
                continue
            run = pshape[-1]  # copied a run of the last dimension at a time
            for r in range(len(values) // run if run else 0):
                at, rest = start[-1], r
                for k in range(len(pshape) - 2, -1, -1):
                    at += (start[k] + rest % pshape[k]) * strides[k]
                    rest //= pshape[k]
                whole[at:at + run] = values[r * run:(r + 1) * run]
        out[name] = whole
    return out, index["metadata"]
