// Byte-level BPE from a Hugging Face tokenizer.json: added tokens split out first (leftmost,
// longest), then the optional NFC normaliser (ICU), the Split pre-tokenizers' regexes and
// ByteLevel's (PCRE2 with Unicode properties), bytes mapped to GPT-2's printable alphabet,
// and the merges applied lowest rank first (leftmost among equals), as `tokenizers` does.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <array>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/error.h"
#include "data/text.h"
#include "data/tokenizer.h"
#include "io/atomic_file.h"

namespace loom::data {

namespace {

using Json = nlohmann::json;

// GPT-2's map from bytes to printable characters: the printable Latin-1 bytes stand for
// themselves, the other 68 for U+0100 onwards in byte order.
struct ByteAlphabet {
  std::array<std::string, 256> utf8;                 // byte -> its character, UTF-8
  std::unordered_map<char32_t, unsigned char> byte;  // character -> byte
  ByteAlphabet() {
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      const char32_t c = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(next++);
      utf8[static_cast<std::size_t>(b)] = encode_utf8(std::u32string(1, c));
      byte[c] = static_cast<unsigned char>(b);
    }
  }
};
const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

// A compiled PCRE2 pattern (UTF, Unicode properties for \p, \s, \w), JIT where available.
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where) {
    int code = 0;
    PCRE2_SIZE offset = 0;
    code_.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP, &code, &offset, nullptr));
    if (!code_) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(code, message.data(), message.size());
      throw Error(where + ": the pattern " + Json(pattern).dump() + " does not compile at offset " +
                  std::to_string(offset) + ": " + reinterpret_cast<const char*>(message.data()));
    }
    pcre2_jit_compile(code_.get(), PCRE2_JIT_COMPLETE);  // interpreted when JIT is unavailable
    match_.reset(pcre2_match_data_create_from_pattern(code_.get(), nullptr));
  }
  // Isolated splitting: every match is a piece, and so is every stretch between matches.
  void split(std::string_view text, std::vector<std::string_view>& out) const {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    std::size_t at = 0, gap = 0;
    while (at < text.size()) {
      const int found = pcre2_match(code_.get(), subject, text.size(), at, PCRE2_NO_UTF_CHECK,
                                    match_.get(), nullptr);
      if (found < 0)
        break;
      const PCRE2_SIZE* span = pcre2_get_ovector_pointer(match_.get());
      if (span[1] == span[0]) {  // an empty match: step over one character
        at = span[0] + 1;
        while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80)
          ++at;
        continue;
      }
      if (span[0] > gap)
        out.push_back(text.substr(gap, span[0] - gap));
      out.push_back(text.substr(span[0], span[1] - span[0]));
      at = gap = span[1];
    }
    if (gap < text.size())
      out.push_back(text.substr(gap));
  }

 private:
  struct CodeFree {
    void operator()(pcre2_code* c) const { pcre2_code_free(c); }
  };
  struct MatchFree {
    void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
  };
  std::unique_ptr<pcre2_code, CodeFree> code_;
  std::unique_ptr<pcre2_match_data, MatchFree> match_;
};

// ByteLevel's own split (use_regex), GPT-2's pattern.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct AddedToken {
  std::string content;
  std::int32_t id;
  bool special;
};

class ByteLevelBpe final : public Tokenizer {
 public:
  ByteLevelBpe(const Json& j, const std::string& where) {
    read_model(j, where);
    read_normalizer(j, where);
    read_pre_tokenizer(j, where);
    read_decoder(j, where);
    if (j.contains("added_tokens") && j["added_tokens"].is_array())
      for (const Json& t : j["added_tokens"]) {
        check(t.is_object() && t.contains("content") && t["content"].is_string() &&
                  t.contains("id") && t["id"].is_number_integer(),
              where + ": added_tokens entry " + t.dump() + " lacks a string content or an id");
        added_.push_back({t["content"].get<std::string>(), t["id"].get<std::int32_t>(),
                          t.value("special", false)});
        vocab_size_ = std::max<std::int64_t>(vocab_size_, added_.back().id + 1);
        check(!added_.back().content.empty(), where + ": an added token has empty content");
      }
    // Longest first, so the first token found at a position is the longest there.
    std::stable_sort(added_.begin(), added_.end(), [](const AddedToken& a, const AddedToken& b) {
      return a.content.size() > b.content.size();
    });
    for (const AddedToken& t : added_)
      added_by_id_[t.id] = t.content;
  }

  std::vector<std::int32_t> encode(std::string_view text) const override {
    decode_utf8(std::string(text), "the text to encode");  // PCRE2 then skips the check
    std::vector<std::int32_t> ids;
    std::unordered_map<std::string, std::vector<std::int32_t>> words;  // this call's cache
    std::size_t start = 0;
    for (std::size_t at = 0; at < text.size();) {
      const AddedToken* hit = added_at(text, at);
      if (hit == nullptr) {
        ++at;
        continue;
      }
      encode_segment(text.substr(start, at - start), ids, words);
      ids.push_back(hit->id);
      at += hit->content.size();
      start = at;
    }
    encode_segment(text.substr(start), ids, words);
    return ids;
  }

  std::string decode(std::span<const std::int32_t> ids) const override {
    std::string bytes;
    const auto& a = alphabet();
    for (std::int32_t id : ids) {
      if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
        bytes += it->second;
        continue;
      }
      check(id >= 0 && static_cast<std::size_t>(id) < id_to_token_.size() &&
                !id_to_token_[static_cast<std::size_t>(id)].empty(),
            "decode: id " + std::to_string(id) + " is not in the vocabulary");
      for (char32_t c : decode_utf8(id_to_token_[static_cast<std::size_t>(id)], "a token")) {
        auto b = a.byte.find(c);
        check(b != a.byte.end(), "decode: token " + std::to_string(id) +
                                     " holds a character outside the byte-level alphabet");
        bytes.push_back(static_cast<char>(b->second));
      }
    }
    return bytes;
  }

  std::int64_t vocab_size() const override { return vocab_size_; }
  std::optional<std::int32_t> token_id(std::string_view token) const override {
    for (const AddedToken& t : added_)
      if (t.content == token)
        return t.id;
    if (auto it = vocab_.find(std::string(token)); it != vocab_.end())
      return it->second;
    return std::nullopt;
  }
  std::optional<std::int32_t> eos() const override {
    for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"})
      if (auto id = token_id(name))
        return id;
    return std::nullopt;
  }
  std::string kind() const override { return "byte-level BPE"; }

 private:
  const AddedToken* added_at(std::string_view text, std::size_t at) const {
    for (const AddedToken& t : added_)
      if (text.compare(at, t.content.size(), t.content) == 0)
        return &t;
    return nullptr;
  }

  void encode_segment(std::string_view segment, std::vector<std::int32_t>& ids,
                      std::unordered_map<std::string, std::vector<std::int32_t>>& words) const {
    if (segment.empty())
      return;
    std::string normalized;
    if (nfc_) {
      UErrorCode status = U_ZERO_ERROR;
      const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
      icu::UnicodeString out =
          nfc->normalize(icu::UnicodeString::fromUTF8(icu::StringPiece(
                             segment.data(), static_cast<std::int32_t>(segment.size()))),
                         status);
      check(U_SUCCESS(status), std::string("NFC normalisation failed: ") + u_errorName(status));
      out.toUTF8String(normalized);
      segment = normalized;
    }
    std::vector<std::string_view> pieces{segment}, next;
    for (const Regex& r : splits_) {
      next.clear();
      for (std::string_view p : pieces)
        r.split(p, next);
      pieces.swap(next);
    }
    for (std::string_view p : pieces) {
      auto [it, fresh] = words.try_emplace(std::string(p));
      if (fresh)
        it->second = bpe(p);
      ids.insert(ids.end(), it->second.begin(), it->second.end());
    }
  }

  // One pre-token's bytes, mapped to the alphabet and merged.
  std::vector<std::int32_t> bpe(std::string_view piece) const {
    const auto& a = alphabet();
    std::string mapped;
    for (unsigned char b : piece)
      mapped += a.utf8[b];
    if (ignore_merges_)
      if (auto it = vocab_.find(mapped); it != vocab_.end())
        return {it->second};
    std::vector<std::int32_t> symbols;
    for (unsigned char b : piece) {
      auto it = vocab_.find(a.utf8[b]);
      check(it != vocab_.end(), "encode: byte " + std::to_string(b) +
                                    " has no token in the vocabulary (not a byte-level BPE?)");
      symbols.push_back(it->second);
    }
    // The lowest-ranked adjacent pair merges first, the leftmost among equals.
    while (symbols.size() > 1) {
      std::size_t best = 0;
      int best_rank = std::numeric_limits<int>::max();
      std::int32_t merged = -1;
      for (std::size_t i = 0; i + 1 < symbols.size(); ++i) {
        auto it = merges_.find(pair_key(symbols[i], symbols[i + 1]));
        if (it != merges_.end() && it->second.first < best_rank) {
          best_rank = it->second.first;
          merged = it->second.second;
          best = i;
        }
      }
      if (merged < 0)
        break;
      symbols[best] = merged;
      symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    }
    return symbols;
  }

  static std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) |
           static_cast<std::uint32_t>(b);
  }

  void read_model(const Json& j, const std::string& where) {
    check(j.contains("model") && j["model"].is_object(), where + ": no 'model' object");
    const Json& m = j["model"];
    const std::string type = m.value("type", "");
    check(type == "BPE", where + ": model.type '" + type +
                             "' is not implemented (BPE; a SentencePiece model loads from "
                             "tokenizer.model)");
    for (const char* field : {"continuing_subword_prefix", "end_of_word_suffix"})
      check(!m.contains(field) || m[field].is_null() || m[field] == "",
            where + ": model." + field + " = " + (m.contains(field) ? m[field].dump() : "") +
                " is not implemented (byte-level BPE has none)");
    check(!m.value("byte_fallback", false),
          where + ": model.byte_fallback = true is not implemented (byte-level BPE needs none)");
    if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"] != 0.0)
      throw Error(where + ": model.dropout = " + m["dropout"].dump() +
                  " (BPE dropout) is not implemented");
    ignore_merges_ = m.value("ignore_merges", false);
    check(m.contains("vocab") && m["vocab"].is_object(), where + ": model.vocab is not an object");
    for (const auto& [token, id] : m["vocab"].items()) {
      check(id.is_number_integer() && id.get<std::int64_t>() >= 0 &&
                id.get<std::int64_t>() < (std::int64_t{1} << 31),
            where + ": model.vocab['" + token + "'] = " + id.dump() + ", expected an id >= 0");
      const auto i = id.get<std::int32_t>();
      vocab_[token] = i;
      if (static_cast<std::size_t>(i) >= id_to_token_.size())
        id_to_token_.resize(static_cast<std::size_t>(i) + 1);
      id_to_token_[static_cast<std::size_t>(i)] = token;
    }
    vocab_size_ = static_cast<std::int64_t>(id_to_token_.size());
    check(m.contains("merges") && m["merges"].is_array(), where + ": model.merges is not a list");
    int rank = 0;
    for (const Json& merge : m["merges"]) {
      std::string left, right;
      if (merge.is_string()) {  // the older "a b" form
        const std::string s = merge.get<std::string>();
        const std::size_t space = s.find(' ');
        check(space != std::string::npos, where + ": merge " + merge.dump() + " is not 'a b'");
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else {
        check(merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string(),
              where + ": merge " + merge.dump() + " is not a pair of tokens");
        left = merge[0].get<std::string>();
        right = merge[1].get<std::string>();
      }
      auto l = vocab_.find(left), r = vocab_.find(right), both = vocab_.find(left + right);
      check(l != vocab_.end() && r != vocab_.end() && both != vocab_.end(),
            where + ": merge " + merge.dump() + " names a token outside the vocabulary");
      merges_.try_emplace(pair_key(l->second, r->second), rank++, both->second);
    }
  }

  void read_normalizer(const Json& j, const std::string& where) {
    if (!j.contains("normalizer") || j["normalizer"].is_null())
      return;
    const Json& n = j["normalizer"];
    std::vector<Json> steps = n.value("type", "") == "Sequence" && n.contains("normalizers")
                                  ? n["normalizers"].get<std::vector<Json>>()
                                  : std::vector<Json>{n};
    for (const Json& s : steps) {
      const std::string type = s.value("type", "");
      check(type == "NFC", where + ": normalizer '" + type + "' is not implemented (NFC)");
      nfc_ = true;
    }
  }

  void read_pre_tokenizer(const Json& j, const std::string& where) {
    check(j.contains("pre_tokenizer") && j["pre_tokenizer"].is_object(),
          where + ": no pre_tokenizer (a byte-level BPE has ByteLevel)");
    const Json& p = j["pre_tokenizer"];
    std::vector<Json> steps = p.value("type", "") == "Sequence" && p.contains("pretokenizers")
                                  ? p["pretokenizers"].get<std::vector<Json>>()
                                  : std::vector<Json>{p};
    bool byte_level = false;
    for (const Json& s : steps) {
      const std::string type = s.value("type", "");
      if (type == "Split") {
        check(s.contains("pattern") && s["pattern"].is_object() && s["pattern"].contains("Regex"),
              where + ": pre_tokenizer Split without a Regex pattern: " + s.dump());
        check(s.value("behavior", "") == "Isolated" && !s.value("invert", false),
              where + ": pre_tokenizer Split behavior '" + s.value("behavior", "") + "' (invert " +
                  (s.value("invert", false) ? "true" : "false") +
                  ") is not implemented (Isolated)");
        splits_.emplace_back(s["pattern"]["Regex"].get<std::string>(), where + ": Split");
      } else if (type == "ByteLevel") {
        check(!s.value("add_prefix_space", false),
              where + ": pre_tokenizer ByteLevel add_prefix_space = true is not implemented");
        if (s.value("use_regex", true))
          splits_.emplace_back(kGpt2Pattern, where + ": ByteLevel");
        byte_level = true;
      } else {
        throw Error(where + ": pre_tokenizer '" + type +
                    "' is not implemented (Split with a regex, ByteLevel)");
      }
    }
    check(byte_level, where + ": the pre_tokenizer has no ByteLevel step (not a byte-level BPE)");
  }

  static void read_decoder(const Json& j, const std::string& where) {
    if (!j.contains("decoder") || j["decoder"].is_null())
      return;
    const std::string type = j["decoder"].value("type", "");
    check(type == "ByteLevel", where + ": decoder '" + type + "' is not implemented (ByteLevel)");
  }

  std::unordered_map<std::string, std::int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::unordered_map<std::uint64_t, std::pair<int, std::int32_t>> merges_;  // rank, merged id
  std::vector<Regex> splits_;
  std::vector<AddedToken> added_;
  std::unordered_map<std::int32_t, std::string> added_by_id_;
  std::int64_t vocab_size_ = 0;
  bool ignore_merges_ = false;
  bool nfc_ = false;
};

}  // namespace

std::unique_ptr<Tokenizer> load_byte_level_bpe(const std::string& path) {
  const Json j = Json::parse(io::read_whole_file(path), nullptr, false);
  check(!j.is_discarded() && j.is_object(), path + ": not a JSON object (a tokenizer.json)");
  return std::make_unique<ByteLevelBpe>(j, path);
}

}  // namespace loom::data
