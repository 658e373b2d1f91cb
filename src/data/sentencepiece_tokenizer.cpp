// SentencePiece models (tokenizer.model) through loom-sentencepiece, a helper process that runs
// libsentencepiece (data/sentencepiece_protocol.h says why it is a process of its own).
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "core/error.h"
#include "data/sentencepiece_protocol.h"
#include "data/tokenizer.h"

extern char** environ;

namespace loom::data {
namespace {

namespace protocol = sentencepiece_protocol;
namespace fs = std::filesystem;

// Where the helper is: $LOOM_SENTENCEPIECE_HELPER, else beside the running program (an
// installed loom), else where the build put it (tests run from the build tree).
std::string helper_path() {
  if (const char* given = std::getenv("LOOM_SENTENCEPIECE_HELPER"); given && *given)
    return given;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && fs::exists(self.parent_path() / "loom-sentencepiece", ec))
    return (self.parent_path() / "loom-sentencepiece").string();
#ifdef LOOM_SENTENCEPIECE_HELPER_BUILT
  if (fs::exists(LOOM_SENTENCEPIECE_HELPER_BUILT, ec))
    return LOOM_SENTENCEPIECE_HELPER_BUILT;
#endif
  throw Error(
      "SentencePiece models are read by the helper program loom-sentencepiece, which is not "
      "beside " +
      (ec ? std::string("this program") : self.string()) +
      " nor where the build put it; build Loom with libsentencepiece-dev, or set "
      "LOOM_SENTENCEPIECE_HELPER to its path");
}

// The helper process and the socket to it: spawned by the constructor; the destructor ends its
// input and waits for it to exit.
class HelperProcess {
 public:
  HelperProcess(const std::string& program, const std::string& model) : model_(model) {
    int ends[2];
    check(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) == 0,
          "cannot make a socket for loom-sentencepiece: " + std::string(std::strerror(errno)));
    socket_ = ends[0];
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, ends[1], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, ends[1], STDOUT_FILENO);
    std::string program_arg = program, model_arg = model;
    char* argv[] = {program_arg.data(), model_arg.data(), nullptr};
    const int spawned = ::posix_spawn(&pid_, program.c_str(), &actions, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(ends[1]);
    if (spawned != 0) {
      ::close(socket_);
      throw Error(model + ": cannot start " + program + ": " + std::strerror(spawned));
    }
  }
  HelperProcess(const HelperProcess&) = delete;
  HelperProcess& operator=(const HelperProcess&) = delete;
  ~HelperProcess() {
    ::close(socket_);  // the helper reads the end of its input and exits
    if (pid_ > 0)
      wait();
  }

  // One request and its reply's payload; a kError reply or a lost helper throws.
  std::string call(char tag, std::string_view payload) {
    check(payload.size() <= protocol::kMaxPayload,
          model_ + ": a text of " + std::to_string(payload.size()) +
              " bytes is over what one SentencePiece call takes (1 GiB)");
    send_all(protocol::frame(tag, payload));
    return receive();
  }

  // The first reply, which the helper sends unasked once the model is loaded.
  std::string receive() {
    char header[protocol::kHeaderBytes];
    receive_exactly(header, sizeof header);
    std::string payload(protocol::payload_length(header), '\0');
    receive_exactly(payload.data(), payload.size());
    check(header[0] != protocol::kError, model_ + ": " + payload);
    check(header[0] == protocol::kReady,
          model_ + ": loom-sentencepiece answered with an unknown tag; is it another version?");
    return payload;
  }

 private:
  void send_all(const std::string& bytes) {
    for (std::size_t at = 0; at < bytes.size();) {
      // MSG_NOSIGNAL: a helper that died is an error here, not a SIGPIPE for the whole program.
      const ssize_t put = ::send(socket_, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
      if (put < 0 && errno == EINTR)
        continue;
      if (put <= 0)
        lost();
      at += static_cast<std::size_t>(put);
    }
  }
  void receive_exactly(char* out, std::size_t n) {
    while (n > 0) {
      const ssize_t got = ::recv(socket_, out, n, 0);
      if (got < 0 && errno == EINTR)
        continue;
      if (got <= 0)
        lost();
      out += got;
      n -= static_cast<std::size_t>(got);
    }
  }
  int wait() {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    return status;
  }
  // The helper closed its end of the socket: it has ended (or is ending), so waiting is short.
  [[noreturn]] void lost() {
    const int status = wait();
    throw Error(model_ + ": loom-sentencepiece " +
                (WIFSIGNALED(status)
                     ? "was killed by signal " + std::to_string(WTERMSIG(status))
                     : "exited with status " + std::to_string(WEXITSTATUS(status))) +
                " without answering");
  }

  std::string model_;
  int socket_ = -1;
  pid_t pid_ = -1;
};

class SentencePiece final : public Tokenizer {
 public:
  explicit SentencePiece(const std::string& model) : helper_(helper_path(), model) {
    std::vector<std::int32_t> facts;
    check(protocol::unpack_ints(helper_.receive(), facts) && facts.size() == 5,
          model + ": loom-sentencepiece sent malformed model facts");
    vocab_ = facts[0];
    eos_ = facts[3];
  }

  std::vector<std::int32_t> encode(std::string_view utf8) const override {
    std::vector<std::int32_t> ids;
    std::lock_guard lock(mutex_);
    check(protocol::unpack_ints(helper_.call(protocol::kEncode, utf8), ids),
          "loom-sentencepiece sent a malformed id list");
    return ids;
  }
  std::string decode(std::span<const std::int32_t> ids) const override {
    std::lock_guard lock(mutex_);
    return helper_.call(protocol::kDecode,
                        protocol::pack_ints(std::vector<std::int32_t>(ids.begin(), ids.end())));
  }
  std::int64_t vocab_size() const override { return vocab_; }
  std::optional<std::int32_t> token_id(std::string_view token) const override {
    std::vector<std::int32_t> id;
    std::lock_guard lock(mutex_);
    check(protocol::unpack_ints(helper_.call(protocol::kPieceId, token), id) && id.size() == 1,
          "loom-sentencepiece sent a malformed id");
    return id[0] >= 0 ? std::optional<std::int32_t>(id[0]) : std::nullopt;
  }
  std::optional<std::int32_t> eos() const override {
    return eos_ >= 0 ? std::optional<std::int32_t>(eos_) : std::nullopt;
  }
  std::string kind() const override { return "SentencePiece"; }

 private:
  mutable std::mutex mutex_;  // one request at a time on the helper's socket
  mutable HelperProcess helper_;
  std::int64_t vocab_ = 0;
  std::int32_t eos_ = -1;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& model) {
  return std::make_unique<SentencePiece>(model);
}

}  // namespace loom::data
