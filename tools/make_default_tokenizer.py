"""Trains the default Llama run's tokenizer (configs/tokenizers/shakespeare-bpe/tokenizer.json):
a byte-level BPE of 1,024 ids with Llama 3's pre-tokenizer, on tiny Shakespeare's first 90%
(the training split; the last 10% validates), with the tokenizers library.
Run: $(scripts/python-env --print) tools/make_default_tokenizer.py"""
import os

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def main():
    text = open(os.path.join(ROOT, "data", "tinyshakespeare", "input.txt"), encoding="utf-8").read()
    train_split = text[: int(len(text) * 0.9)]
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=["<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([train_split], trainer)
    out = os.path.join(ROOT, "configs", "tokenizers", "shakespeare-bpe", "tokenizer.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tok.save(out)
    print("wrote", os.path.normpath(out), tok.get_vocab_size(), "ids;",
          len(tok.encode(text).ids), "tokens for", len(text.encode()), "bytes")


if __name__ == "__main__":
    main()
