#include "io/read_only_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace loom::io {

ReadOnlyFile::ReadOnlyFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  check(fd_ >= 0, [&] { return path_ + ": cannot open (" + std::strerror(errno) + ")"; });
  struct stat st {};
  const bool stated = ::fstat(fd_, &st) == 0;
  if (!stated || !S_ISREG(st.st_mode)) {
    const std::string why = stated ? "not a regular file" : std::strerror(errno);
    ::close(fd_);
    throw Error(path_ + ": cannot read (" + why + ")");
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0)
    ::close(fd_);
}

void ReadOnlyFile::read(std::uint64_t offset, std::size_t n, void* out) const {
  auto* dst = static_cast<char*>(out);
  while (n > 0) {
    const ssize_t got = ::pread(fd_, dst, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR)
      continue;
    check(got > 0, [&] {
      return path_ + ": " +
             (got == 0 ? "ends at byte " + std::to_string(offset) + ", " + std::to_string(n) +
                             " bytes short (the file shrank after it was opened)"
                       : "read error at byte " + std::to_string(offset) + " (" +
                             std::strerror(errno) + ")");
    });
    dst += got;
    offset += static_cast<std::uint64_t>(got);
    n -= static_cast<std::size_t>(got);
  }
}

}  // namespace loom::io
