#include "io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace loom::io {

void write_file_atomically(const std::string& path, std::string_view contents) {
  namespace fs = std::filesystem;
  fs::path target(path);
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  // Built by appends: GCC 12 at -O3 gives a false -Wrestrict on the chained operator+.
  std::string temp_name(".");
  temp_name.append(target.filename().string()).append(".tmp.").append(std::to_string(getpid()));
  std::string temp = (dir / temp_name).string();
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  check(fd >= 0, path + ": cannot create temporary file " + temp + ": " + std::strerror(errno));
  auto fail = [&](const std::string& what) {
    int err = errno;
    ::close(fd);
    ::unlink(temp.c_str());
    throw Error(path + ": " + what + ": " + std::strerror(err));
  };
  std::size_t written = 0;
  while (written < contents.size()) {
    ssize_t n = ::write(fd, contents.data() + written, contents.size() - written);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      fail("write failed");
    written += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0)
    fail("fsync failed");
  if (::close(fd) != 0) {
    ::unlink(temp.c_str());
    throw Error(path + ": close failed: " + std::strerror(errno));
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(temp.c_str());
    throw Error(path + ": rename failed: " + std::strerror(err));
  }
  int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {  // make the rename itself durable
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

std::string read_whole_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  check(file.good(), path + ": cannot open (missing or unreadable)");
  std::ostringstream contents;
  contents << file.rdbuf();
  check(!file.bad(), path + ": read error");
  return contents.str();
}

}  // namespace loom::io
