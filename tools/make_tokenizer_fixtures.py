"""Trains one tokenizer of each kind Loom reads on data/multilingual/fortunes-ru-de.txt, with
the libraries themselves, and records the ids they give for that text:
  gpt2/      byte-level BPE, GPT-2's pre-tokenizer (ByteLevel with its built-in regex)
  llama3/    byte-level BPE, Llama 3's split regex then ByteLevel, ignore_merges
  qwen2/     byte-level BPE, NFC normalisation, Qwen2's split regex then ByteLevel
  llama2/    SentencePiece BPE as Llama 2, Mistral and TinyLlama ship it (tokenizer.model: byte
             fallback, split digits, identity normalisation, a dummy prefix; unk 0, <s> 1, </s> 2)
  unigram/   SentencePiece unigram with its default NFKC normalisation (T5's kind)
Each folder holds tokenizer.json and expected.json:
the number of ids for the whole text, their FNV-1a 64 hash (over the ids as little-endian
uint32), the first 4,000 ids, and a few short strings with their ids (special and added
tokens among them). Ids are without the post-processor's additions (add_special_tokens
False). Loom's tests compare against these without Python.
SentencePiece folders also record, under "sentencepiece_0_1", the count and hash that the 0.1
line of the library (Debian 12's libsentencepiece 0.1.97, which Loom runs) gives for the whole
text, when SENTENCEPIECE_0_1_PYTHON names a Python with sentencepiece 0.1.99 installed: the 0.2
line's unigram encoder chooses other pieces at a few places (BPE models agree).
Run: SENTENCEPIECE_0_1_PYTHON=/path/to/python $(scripts/python-env --print) tools/make_tokenizer_fixtures.py"""
import json
import os
import shutil
import subprocess

import sentencepiece as spm
import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TEXT = os.path.join(ROOT, "data", "multilingual", "fortunes-ru-de.txt")
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizers")
VOCAB = 2000
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PROBES = ["Hello, world!", "  leading spaces and trailing  ", "Ёжик в тумане — 2024 год.",
          "Grüße aus Köln: 12345 Äpfel", "tabs\tand\nnewlines\r\n\r\nend", "emoji 🙂 and 漢字",
          "it's we'll THEY'RE", "<|endoftext|>between<|endoftext|>", "a<|im_start|>b <|im_end|> c",
          "", " ", "e\u0301 composed é"]


def fnv1a(ids):
    h = 0xcbf29ce484222325
    for i in ids:
        for byte in int(i).to_bytes(4, "little"):
            h = ((h ^ byte) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def byte_level(name, pre, normalizer=None, ignore_merges=False, specials=("<|endoftext|>",),
               added=()):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train([TEXT], trainer)
    if added:
        tok.add_tokens(list(added))
    folder = os.path.join(OUT, name)
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    encode = lambda s: tok.encode(s, add_special_tokens=False).ids
    decode = lambda ids: tok.decode(ids, skip_special_tokens=False)
    return folder, encode, decode


def sentencepiece(name, **options):
    folder = os.path.join(OUT, name)
    os.makedirs(folder, exist_ok=True)
    spm.SentencePieceTrainer.train(input=TEXT, model_prefix=os.path.join(folder, "tokenizer"),
                                   vocab_size=VOCAB, num_threads=2, minloglevel=2, **options)
    os.remove(os.path.join(folder, "tokenizer.vocab"))
    sp = spm.SentencePieceProcessor(model_file=os.path.join(folder, "tokenizer.model"))
    return folder, sp.encode, lambda ids: sp.decode(ids)


ENCODE_0_1 = """
import json, sys, sentencepiece as spm
sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
print(json.dumps({"library": "sentencepiece " + spm.__version__,
                  "ids": sp.encode(open(sys.argv[2], encoding="utf-8").read())}))
"""


def sentencepiece_0_1(folder):
    python = os.environ.get("SENTENCEPIECE_0_1_PYTHON")
    if not python:
        return None
    out = json.loads(subprocess.run([python, "-c", ENCODE_0_1, os.path.join(folder, "tokenizer.model"), TEXT],
                                    check=True, capture_output=True, text=True).stdout)
    assert out["library"].startswith("sentencepiece 0.1"), out["library"]
    return {"library": out["library"], "count": len(out["ids"]), "fnv1a64": fnv1a(out["ids"])}


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    text = open(TEXT, encoding="utf-8").read()
    kinds = [
        byte_level("gpt2", pre_tokenizers.ByteLevel(add_prefix_space=False)),
        byte_level("llama3", pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
            ignore_merges=True, specials=("<|begin_of_text|>", "<|end_of_text|>")),
        byte_level("qwen2", pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
            normalizer=normalizers.NFC(), specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
            added=("Кащеев",)),
        sentencepiece("llama2", model_type="bpe", byte_fallback=True, split_digits=True,
                      allow_whitespace_only_pieces=True, normalization_rule_name="identity",
                      add_dummy_prefix=True, remove_extra_whitespaces=False, unk_id=0, bos_id=1,
                      eos_id=2, pad_id=-1, character_coverage=0.99995),
        sentencepiece("unigram", model_type="unigram"),
    ]
    for folder, encode, decode in kinds:
        ids = encode(text)
        library = (f"sentencepiece {spm.__version__}" if os.path.exists(os.path.join(folder, "tokenizer.model"))
                   else f"tokenizers {tokenizers.__version__}")
        expected = {"library": library,
                    "text": "data/multilingual/fortunes-ru-de.txt", "count": len(ids), "fnv1a64": fnv1a(ids),
                    "first_ids": ids[:4000],
                    "roundtrip": decode(ids) == text,
                    "probes": [{"text": p, "ids": encode(p)} for p in PROBES]}
        if library.startswith("sentencepiece"):
            older = sentencepiece_0_1(folder)
            if older is not None:
                expected["sentencepiece_0_1"] = older
        with open(os.path.join(folder, "expected.json"), "w", encoding="utf-8") as f:
            json.dump(expected, f, ensure_ascii=False, separators=(",", ":"))
        print(os.path.basename(folder), len(ids), "ids; decode(encode(text)) == text:", expected["roundtrip"])


if __name__ == "__main__":
    main()
