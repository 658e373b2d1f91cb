// data/sentencepiece_protocol.h — how Loom talks to loom-sentencepiece, the helper program that
// runs Debian's libsentencepiece in a process of its own. The library carries a private copy of
// protobuf-lite whose symbols it exports; in one process with the full libprotobuf (which the
// ONNX importer links) the two copies bind to each other's symbols and the process crashes
// while starting. A child process keeps them apart at the cost of one round trip per call.
//
// Both ways, each message is a frame: one tag byte, the payload's length as 4 little-endian
// bytes, the payload. The helper is started with the model's path as its one argument and
// answers first with kReady (payload: the model's facts) or kError (payload: the message).
// Then, until its input ends, each request gets one reply: kReady with the result or kError.
//   kEncode  UTF-8 text              -> int32 ids
//   kDecode  int32 ids               -> the text
//   kPieceId a piece's text          -> its int32 id, or -1 where the vocabulary lacks it
// Integers are little-endian int32. The facts: vocab size, unk, bos, eos, pad ids (-1: none).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data::sentencepiece_protocol {

inline constexpr char kReady = 'R', kError = 'X';
inline constexpr char kEncode = 'E', kDecode = 'D', kPieceId = 'P';
inline constexpr std::size_t kHeaderBytes = 5;
// A frame's payload is at most 1 GiB: longer documents are split before they are encoded.
inline constexpr std::uint32_t kMaxPayload = 1u << 30;

inline std::string frame(char tag, std::string_view payload) {
  std::string out(kHeaderBytes + payload.size(), '\0');
  out[0] = tag;
  const auto n = static_cast<std::uint32_t>(payload.size());
  for (int k = 0; k < 4; ++k)
    out[1 + k] = static_cast<char>((n >> (8 * k)) & 0xFFu);
  std::memcpy(out.data() + kHeaderBytes, payload.data(), payload.size());
  return out;
}

inline std::uint32_t payload_length(const char* header) {
  std::uint32_t n = 0;
  for (int k = 0; k < 4; ++k)
    n |= static_cast<std::uint32_t>(static_cast<unsigned char>(header[1 + k])) << (8 * k);
  return n;
}

inline std::string pack_ints(const std::vector<std::int32_t>& values) {
  std::string out(values.size() * 4, '\0');
  for (std::size_t i = 0; i < values.size(); ++i) {
    const auto v = static_cast<std::uint32_t>(values[i]);
    for (int k = 0; k < 4; ++k)
      out[4 * i + k] = static_cast<char>((v >> (8 * k)) & 0xFFu);
  }
  return out;
}

// The ints a payload holds; false where its length is not a multiple of 4.
inline bool unpack_ints(std::string_view payload, std::vector<std::int32_t>& values) {
  if (payload.size() % 4 != 0)
    return false;
  values.resize(payload.size() / 4);
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::uint32_t v = 0;
    for (int k = 0; k < 4; ++k)
      v |= static_cast<std::uint32_t>(static_cast<unsigned char>(payload[4 * i + k])) << (8 * k);
    values[i] = static_cast<std::int32_t>(v);
  }
  return true;
}

}  // namespace loom::data::sentencepiece_protocol
