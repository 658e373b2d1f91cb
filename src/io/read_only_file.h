// io/read_only_file.h — a file opened for reading at any offset (pread), held open so that
// what is read later is the file that was opened, even if a newer one replaces it by
// rename (the way Loom writes every file: io/atomic_file.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace loom::io {

class ReadOnlyFile {
 public:
  // Opens `path`; throws naming it when it is missing or unreadable.
  explicit ReadOnlyFile(std::string path);
  ~ReadOnlyFile();
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;

  const std::string& path() const { return path_; }
  std::uint64_t size() const { return size_; }  // at opening
  // Reads bytes [offset, offset + n) into `out`; throws naming the file when they are not
  // all there (the file shrank since it was opened) or the read fails.
  void read(std::uint64_t offset, std::size_t n, void* out) const;

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

}  // namespace loom::io
