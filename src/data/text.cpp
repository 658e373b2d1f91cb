#include "data/text.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "nn/init.h"

namespace loom::data {

CharTokenizer::CharTokenizer(std::vector<char32_t> alphabet) : alphabet_(std::move(alphabet)) {
  check(std::is_sorted(alphabet_.begin(), alphabet_.end()) &&
            std::adjacent_find(alphabet_.begin(), alphabet_.end()) == alphabet_.end(),
        "tokenizer: alphabet must be sorted and distinct");
}

CharTokenizer CharTokenizer::from_text(const std::u32string& text) {
  std::set<char32_t> distinct(text.begin(), text.end());
  return CharTokenizer(std::vector<char32_t>(distinct.begin(), distinct.end()));
}

std::int32_t CharTokenizer::encode_char(char32_t c) const {
  auto it = std::lower_bound(alphabet_.begin(), alphabet_.end(), c);
  return it != alphabet_.end() && *it == c ? static_cast<std::int32_t>(it - alphabet_.begin()) : -1;
}

std::vector<std::int32_t> CharTokenizer::encode(const std::u32string& text,
                                                const std::string& what) const {
  std::vector<std::int32_t> ids;
  ids.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    std::int32_t id = encode_char(text[i]);
    if (id < 0) {  // the message is built only on failure: this loop runs once per character
      std::ostringstream code;
      code << std::hex << static_cast<std::uint32_t>(text[i]);
      throw Error(what + ": character U+" + code.str() + " at position " + std::to_string(i) +
                  " is not in the model's vocabulary");
    }
    ids.push_back(id);
  }
  return ids;
}

std::string CharTokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::u32string text;
  for (std::int32_t id : ids) {
    check(id >= 0 && id < size(), "tokenizer: id " + std::to_string(id) +
                                      " outside vocabulary of " + std::to_string(size()));
    text.push_back(alphabet_[id]);
  }
  return encode_utf8(text);
}

std::string CharTokenizer::alphabet_utf8() const {
  return encode_utf8(std::u32string(alphabet_.begin(), alphabet_.end()));
}

std::u32string decode_utf8(const std::string& bytes, const std::string& what) {
  std::u32string out;
  out.reserve(bytes.size());
  std::size_t i = 0;
  auto fail = [&](const char* why) {
    throw Error(what + ": invalid UTF-8 at byte " + std::to_string(i) + " (" + why +
                "); expected a UTF-8 text file");
  };
  while (i < bytes.size()) {
    auto b0 = static_cast<unsigned char>(bytes[i]);
    int extra = 0;
    char32_t cp = 0;
    if (b0 < 0x80) {
      extra = 0;
      cp = b0;
    } else if ((b0 & 0xE0) == 0xC0) {
      extra = 1;
      cp = b0 & 0x1F;
    } else if ((b0 & 0xF0) == 0xE0) {
      extra = 2;
      cp = b0 & 0x0F;
    } else if ((b0 & 0xF8) == 0xF0) {
      extra = 3;
      cp = b0 & 0x07;
    } else
      fail("bad lead byte");
    if (extra > 0 && i + extra >= bytes.size())
      fail("truncated sequence");
    for (int k = 1; k <= extra; ++k) {
      auto b = static_cast<unsigned char>(bytes[i + k]);
      if ((b & 0xC0) != 0x80)
        fail("bad continuation byte");
      cp = (cp << 6) | (b & 0x3F);
    }
    static constexpr char32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      fail("overlong or out-of-range code point");
    out.push_back(cp);
    i += extra + 1;
  }
  return out;
}

std::string encode_utf8(const std::u32string& text) {
  std::string out;
  for (char32_t cp : text) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  return out;
}

TextDataset TextDataset::load(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  check(file.good(), path + ": cannot open the data file (missing or unreadable)");
  std::ostringstream contents;
  contents << file.rdbuf();
  check(!file.bad(), path + ": read error");
  std::u32string text = decode_utf8(contents.str(), path);
  check(text.size() >= 2,
        path + ": holds " + std::to_string(text.size()) + " characters; expected at least 2");
  TextDataset ds;
  ds.source_ = path;
  ds.tokenizer_ = CharTokenizer::from_text(text);
  ds.vocab_ = ds.tokenizer_.size();
  std::vector<std::int32_t> ids = ds.tokenizer_.encode(text, path);
  std::size_t n_train =
      static_cast<std::size_t>(static_cast<double>(ids.size()) * 0.9);  // int(n * 0.9)
  ds.train_.assign(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n_train));
  ds.val_.assign(ids.begin() + static_cast<std::ptrdiff_t>(n_train), ids.end());
  return ds;
}

TextDataset TextDataset::from_ids(std::vector<std::int32_t> ids, std::int64_t vocab,
                                  const std::string& source) {
  check(ids.size() >= 2,
        source + ": holds " + std::to_string(ids.size()) + " tokens; expected at least 2");
  for (std::int32_t id : ids)
    check(id >= 0 && id < vocab, source + ": token id " + std::to_string(id) +
                                     " is outside the vocabulary of " + std::to_string(vocab));
  TextDataset ds;
  ds.source_ = source;
  ds.vocab_ = vocab;
  std::size_t n_train = static_cast<std::size_t>(static_cast<double>(ids.size()) * 0.9);
  ds.train_.assign(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n_train));
  ds.val_.assign(ids.begin() + static_cast<std::ptrdiff_t>(n_train), ids.end());
  return ds;
}

TextDataset TextDataset::random(std::int64_t vocab, std::int64_t tokens, std::uint64_t seed) {
  check(vocab > 0, "random data: vocab = " + std::to_string(vocab) + ", expected > 0");
  TextDataset ds;
  ds.source_ = "random";
  ds.vocab_ = vocab;
  nn::Rng rng(seed);
  std::vector<std::int32_t> ids(tokens);
  for (auto& id : ids)
    id = static_cast<std::int32_t>(rng.next() % static_cast<std::uint64_t>(vocab));
  std::size_t n_train = static_cast<std::size_t>(static_cast<double>(ids.size()) * 0.9);
  ds.train_.assign(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n_train));
  ds.val_.assign(ids.begin() + static_cast<std::ptrdiff_t>(n_train), ids.end());
  return ds;
}

Batch TextDataset::sample(const std::vector<std::int32_t>& split, std::int64_t batch,
                          std::int64_t context, std::uint64_t seed, Backend& backend) const {
  std::int64_t n = static_cast<std::int64_t>(split.size());
  check(n > context, source_ + ": split has " + std::to_string(n) +
                         " tokens; context = " + std::to_string(context) + " needs at least " +
                         std::to_string(context + 1));
  nn::Rng rng(seed);
  std::vector<std::int32_t> x(batch * context), y(batch * context);
  for (std::int64_t b = 0; b < batch; ++b) {
    std::int64_t start =
        static_cast<std::int64_t>(rng.next() % static_cast<std::uint64_t>(n - context));
    std::copy_n(split.begin() + start, context, x.begin() + b * context);
    std::copy_n(split.begin() + start + 1, context, y.begin() + b * context);
  }
  return {Tensor::from_ints({batch, context}, x, backend),
          Tensor::from_ints({batch * context}, y, backend)};
}

std::vector<Batch> eval_windows(const std::vector<std::int32_t>& tokens, std::int64_t context,
                                std::int64_t batch, Backend& backend, bool full_batches_only) {
  std::int64_t windows = (static_cast<std::int64_t>(tokens.size()) - 1) / context;
  if (full_batches_only)
    windows -= windows % batch;
  std::vector<Batch> batches;
  for (std::int64_t first = 0; first < windows; first += batch) {
    std::int64_t count = std::min(batch, windows - first);
    std::vector<std::int32_t> x(count * context), y(count * context);
    for (std::int64_t w = 0; w < count; ++w) {
      std::int64_t start = (first + w) * context;
      std::copy_n(tokens.begin() + start, context, x.begin() + w * context);
      std::copy_n(tokens.begin() + start + 1, context, y.begin() + w * context);
    }
    batches.push_back({Tensor::from_ints({count, context}, x, backend),
                       Tensor::from_ints({count * context}, y, backend)});
  }
  return batches;
}

}  // namespace loom::data
