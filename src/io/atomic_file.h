// io/atomic_file.h — write a file so that readers see the old file or the whole new
// one, never a torn one: temp file in the same directory, fsync, rename, fsync dir.
#pragma once

#include <string>
#include <string_view>

namespace loom::io {

// Writes `contents` (possibly in pieces) to `path` atomically; throws naming the path.
void write_file_atomically(const std::string& path, std::string_view contents);

// The whole file as bytes; throws naming the path when it cannot be opened or read.
std::string read_whole_file(const std::string& path);

}  // namespace loom::io
