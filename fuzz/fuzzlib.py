"""What fuzz/make-corpus, fuzz/run and fuzz/unpack share: the harnesses and their limits."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Between the files of a multi-file input (catalog, idx); the same as fuzz_common.h.
FILE_SEPARATOR = b"\n--8<-- loom-fuzz-next-file --8<--\n"

# harness -> (max_len in bytes, the tests/fixtures/fuzz folders holding its regressions)
HARNESSES = {
    "safetensors": (65536, ["safetensors"]),
    "onnx_tensor": (16384, ["onnx_tensor"]),
    "onnx_model": (65536, ["onnx_model"]),
    "train_config": (4096, ["train_config"]),
    "fleet": (4096, ["fleet"]),
    "training_jobs": (4096, ["training_jobs"]),
    "gavel_trace": (8192, ["gavel"]),
    "alibaba": (8192, ["alibaba"]),
    "catalog": (32768, ["catalog", "plan_runs"]),
    "idx": (16384, ["idx"]),
    "text": (8192, ["text"]),
    "job_spec": (8192, ["job_spec"]),
    "pools": (8192, ["pools"]),
    "sharded_index": (16384, ["sharded_index"]),
}

# The file names of a multi-file input's parts, in order (fuzz/unpack).
PARTS = {
    "catalog": ["chips.yaml", "models.yaml", "systems.yaml", "calibration-runs.yaml", "software.yaml"],
    "idx": ["NAME-images.idx", "NAME-labels.idx"],
    "alibaba": ["NAME-pods.csv", "NAME-nodes.csv"],
    "sharded_index": ["index.json", "shard-00000.safetensors", "shard-00001.safetensors"],
}


def pack(parts):
    """One input holding several files (bytes each), as the multi-file harnesses split it."""
    return FILE_SEPARATOR.join(parts)


def unpack(data):
    return data.split(FILE_SEPARATOR)
