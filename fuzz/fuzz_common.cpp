#include "fuzz_common.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace loom::fuzz {

std::vector<std::string> split_files(std::string_view input) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t at = input.find(kFileSeparator, start);
    if (at == std::string_view::npos) {
      parts.emplace_back(input.substr(start));
      return parts;
    }
    parts.emplace_back(input.substr(start, at - start));
    start = at + kFileSeparator.size();
  }
}

namespace {

void remove_scratch_dir() {
  std::error_code ec;
  std::filesystem::remove_all(scratch_dir(), ec);
}

}  // namespace

const std::string& scratch_dir() {
  // Never destroyed: the atexit handler that removes the folder runs after the static
  // destructors of everything constructed later, which would include this string.
  static const std::string* dir = [] {
    std::error_code ec;
    std::filesystem::path base = std::filesystem::temp_directory_path(ec);
    if (ec)
      base = "/tmp";
    std::string templ = (base / "loom-fuzz-XXXXXX").string();
    if (::mkdtemp(templ.data()) == nullptr) {
      std::perror("loom fuzz: mkdtemp");
      std::abort();
    }
    return new std::string(templ);
  }();
  static const bool registered = std::atexit(remove_scratch_dir) == 0;
  (void)registered;
  return *dir;
}

std::string write_scratch(const std::string& name, std::string_view bytes) {
  const std::string path = scratch_dir() + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    std::perror(("loom fuzz: cannot write " + path).c_str());
    std::abort();  // the harness's own failure, not Loom's: stop loudly
  }
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) {
    std::perror(("loom fuzz: short write to " + path).c_str());
    std::abort();
  }
  std::fclose(f);
  return path;
}

void remove_scratch(const std::string& name) {
  std::error_code ec;
  std::filesystem::remove(scratch_dir() + "/" + name, ec);
}

std::string source_dir() {
  if (const char* dir = std::getenv("LOOM_SOURCE_DIR"); dir != nullptr && *dir != '\0')
    return dir;
  return LOOM_FUZZ_SOURCE_DIR;
}

void single_threaded() {
  ::setenv("OMP_NUM_THREADS", "1", /*overwrite=*/0);
}

}  // namespace loom::fuzz
