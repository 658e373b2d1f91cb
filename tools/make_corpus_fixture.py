"""Writes tests/fixtures/corpora/megatron.{bin,idx}: a small corpus built by megatron-core's
own IndexedDatasetBuilder (as Megatron-LM's preprocess_data.py and MindSpeed build theirs),
and megatron.json with the documents megatron-core's IndexedDataset reads back from it.
Documents: the fortunes of data/multilingual/fortunes-ru-de.txt (first 40), tokenized by
tests/fixtures/tokenizers/llama3, each followed by <|end_of_text|>; stored as uint16.

With --check PREFIX it instead reads a corpus Loom wrote (loom data prepare) through
megatron-core's IndexedDataset and prints whether its documents equal Loom's tokenizer's ids
(tokenizers library) for the same inputs given in --inputs.
Run: $(scripts/python-env --print) tools/make_corpus_fixture.py [--check PREFIX --inputs F...]"""
import argparse
import json
import os

import numpy
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
from tokenizers import Tokenizer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TOKENIZER = os.path.join(ROOT, "tests", "fixtures", "tokenizers", "llama3", "tokenizer.json")


def documents_of(path, count):
    text = open(path, encoding="utf-8").read()
    return [d for d in text.split("\n\t\t-- ") if d][:count]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--check")
    p.add_argument("--inputs", nargs="*", default=[])
    a = p.parse_args()
    tok = Tokenizer.from_file(TOKENIZER)
    eos = tok.token_to_id("<|end_of_text|>")
    if a.check:
        dataset = IndexedDataset(a.check)
        expected = [tok.encode(open(f, encoding="utf-8").read(), add_special_tokens=False).ids + [eos]
                    for f in a.inputs]
        got = [dataset[i].tolist() for i in range(len(dataset))]
        print(f"megatron-core read {len(got)} documents, {sum(map(len, got))} tokens from {a.check}; "
              f"equal to the tokenizers library's ids + EOS: {got == expected}")
        return
    out = os.path.join(ROOT, "tests", "fixtures", "corpora")
    os.makedirs(out, exist_ok=True)
    prefix = os.path.join(out, "megatron")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.uint16)
    for doc in documents_of(os.path.join(ROOT, "data", "multilingual", "fortunes-ru-de.txt"), 40):
        ids = tok.encode(doc, add_special_tokens=False).ids + [eos]
        builder.add_document(numpy.array(ids, dtype=numpy.int64), [len(ids)])
    builder.finalize(prefix + ".idx")
    dataset = IndexedDataset(prefix)
    with open(prefix + ".json", "w") as f:
        json.dump({"documents": [dataset[i].tolist() for i in range(len(dataset))]}, f)
    print("wrote", prefix, len(dataset), "documents")


if __name__ == "__main__":
    main()
