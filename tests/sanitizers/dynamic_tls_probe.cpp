// The sanitizer runtime's misreading of dynamic TLS, made to happen on purpose
// (src/core/sanitizer_defaults.cpp.in says what it is and why Loom turns the interceptor
// off). Threads start one after another, each touching the thread-local data of a library
// loaded with dlopen, until one thread's block lands 16 bytes past a 4 KiB boundary: the
// offset at which the runtime takes the block for one with glibc 2.19's header and reads
// a start and a size from the allocator's bytes before it. That thread is left alive
// while main returns, so LeakSanitizer's exit-time check scans its dynamic TLS: with the
// interceptor on, its tracer crashes ("Tracer caught signal 11"); with Loom's default it
// finishes, and finds no leak.
// Usage: dynamic_tls_probe path/to/libdynamic_tls_library.so
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: dynamic_tls_probe LIBRARY\n");
    return 2;
  }
  void* library = dlopen(argv[1], RTLD_NOW);
  if (library == nullptr) {
    std::fprintf(stderr, "dynamic_tls_probe: dlopen %s: %s\n", argv[1], dlerror());
    return 2;
  }
  using BlockFn = char* (*)();
  auto block_of_this_thread = reinterpret_cast<BlockFn>(dlsym(library, "dynamic_tls_block"));
  if (block_of_this_thread == nullptr) {
    std::fprintf(stderr, "dynamic_tls_probe: %s has no dynamic_tls_block\n", argv[1]);
    return 2;
  }
  constexpr std::uintptr_t kPage = 4096, kMisreadOffset = 16;
  // Each thread's block is freed when it ends, and the allocator does not hand the same
  // place out again soon (ASan's quarantine), so every thread's block lies further on in
  // its size class; the fillers move the next one on further.
  std::vector<std::vector<char>> fillers;
  for (int attempt = 0; attempt < 100000; ++attempt) {
    std::atomic<std::uintptr_t> address{0};
    std::thread thread([&] {
      address = reinterpret_cast<std::uintptr_t>(block_of_this_thread());
      if (address % kPage == kMisreadOffset)
        for (;;)  // alive through the leak check at exit
          std::this_thread::sleep_for(std::chrono::seconds(1));
    });
    while (address == 0)
      std::this_thread::yield();
    if (address % kPage == kMisreadOffset) {
      std::fprintf(stderr,
                   "dynamic_tls_probe: thread %d's dynamic TLS block is at %#jx, 16 bytes past a "
                   "4 KiB boundary; it stays alive through LeakSanitizer's check at exit\n",
                   attempt, static_cast<std::uintmax_t>(address.load()));
      thread.detach();
      return 0;
    }
    thread.join();
    fillers.emplace_back(24);
  }
  std::fprintf(stderr, "dynamic_tls_probe: no block landed 16 bytes past a 4 KiB boundary\n");
  return 3;
}
