// loom-sentencepiece: runs libsentencepiece for Loom in a process of its own
// (data/sentencepiece_protocol.h says why and how). Usage: loom-sentencepiece MODEL, then frames
// on standard input and output; it ends when its input does.
#include <sentencepiece_processor.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>
#include <vector>

#include "data/sentencepiece_protocol.h"

namespace protocol = loom::data::sentencepiece_protocol;

namespace {

bool read_exactly(char* out, std::size_t n) {
  while (n > 0) {
    const ssize_t got = ::read(STDIN_FILENO, out, n);
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0)
      return false;
    out += got;
    n -= static_cast<std::size_t>(got);
  }
  return true;
}

bool write_all(const std::string& bytes) {
  const char* at = bytes.data();
  std::size_t n = bytes.size();
  while (n > 0) {
    const ssize_t put = ::write(STDOUT_FILENO, at, n);
    if (put < 0 && errno == EINTR)
      continue;
    if (put <= 0)
      return false;
    at += put;
    n -= static_cast<std::size_t>(put);
  }
  return true;
}

std::string answer(const sentencepiece::SentencePieceProcessor& sp, char tag, const std::string& in,
                   char& reply) {
  reply = protocol::kError;
  switch (tag) {
    case protocol::kEncode: {
      std::vector<int> ids;
      const auto status = sp.Encode(in, &ids);
      if (!status.ok())
        return "encoding failed: " + status.ToString();
      reply = protocol::kReady;
      return protocol::pack_ints(std::vector<std::int32_t>(ids.begin(), ids.end()));
    }
    case protocol::kDecode: {
      std::vector<std::int32_t> ids;
      if (!protocol::unpack_ints(in, ids))
        return "a decode request's payload is not a whole number of int32 ids";
      for (std::int32_t id : ids)
        if (id < 0 || id >= sp.GetPieceSize())
          return "id " + std::to_string(id) + " is outside the vocabulary [0, " +
                 std::to_string(sp.GetPieceSize()) + ")";
      std::string text;
      const auto status = sp.Decode(std::vector<int>(ids.begin(), ids.end()), &text);
      if (!status.ok())
        return "decoding failed: " + status.ToString();
      reply = protocol::kReady;
      return text;
    }
    case protocol::kPieceId: {
      const int id = sp.PieceToId(in);
      // PieceToId answers unk_id for a piece it lacks: only an id whose piece is this one counts.
      const bool found = id >= 0 && id < sp.GetPieceSize() && sp.IdToPiece(id) == in;
      reply = protocol::kReady;
      return protocol::pack_ints({found ? id : -1});
    }
    default:
      return std::string("unknown request tag '") + tag + "'";
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr,
                 "usage: loom-sentencepiece MODEL\n"
                 "Serves a SentencePiece model to Loom over standard input and output.\n");
    return 2;
  }
  sentencepiece::SentencePieceProcessor sp;
  const auto status = sp.Load(argv[1]);
  if (!status.ok()) {
    write_all(protocol::frame(
        protocol::kError,
        std::string(argv[1]) + ": not a SentencePiece model: " + status.ToString()));
    return 1;
  }
  if (!write_all(protocol::frame(protocol::kReady,
                                 protocol::pack_ints({sp.GetPieceSize(), sp.unk_id(), sp.bos_id(),
                                                      sp.eos_id(), sp.pad_id()}))))
    return 1;
  char header[protocol::kHeaderBytes];
  std::string payload;
  while (read_exactly(header, sizeof header)) {
    const std::uint32_t n = protocol::payload_length(header);
    if (n > protocol::kMaxPayload)
      return 1;
    payload.resize(n);
    if (!read_exactly(payload.data(), n))
      return 1;
    char reply = protocol::kError;
    const std::string result = answer(sp, header[0], payload, reply);
    if (!write_all(protocol::frame(reply, result)))
      return 1;
  }
  return 0;
}
