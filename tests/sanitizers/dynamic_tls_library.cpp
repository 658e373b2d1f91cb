// A library with thread-local data. Loaded with dlopen, its TLS is dynamic: glibc allocates
// each thread's block with malloc on the thread's first access, found through
// __tls_get_addr (as PoCL's and LLVM's are when the OpenCL ICD loader opens PoCL).
namespace {
thread_local char block[24];
}

extern "C" char* dynamic_tls_block() {
  return block;
}
