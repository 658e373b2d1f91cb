#include "backends/cuda/cuda_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/emulator/emulated_api.h"
#include "core/error.h"

namespace loom::cuda {
namespace {

#define LOOM_STRINGIFY_EXPANDED(x) LOOM_STRINGIFY(x)
#define LOOM_STRINGIFY(x) #x

// A dlopen handle kept for the life of the process (the API table points into it).
void* open_first(std::initializer_list<const char*> names, std::string& tried) {
  for (const char* name : names) {
    if (void* handle = dlopen(name, RTLD_NOW | RTLD_LOCAL))
      return handle;
    tried += std::string(tried.empty() ? "" : ", ") + name;
  }
  return nullptr;
}

template <class Fn>
bool resolve(void* library, const char* symbol, Fn& slot, std::string& missing) {
  slot = reinterpret_cast<Fn>(dlsym(library, symbol));
  if (slot == nullptr)
    missing += std::string(missing.empty() ? "" : ", ") + symbol;
  return slot != nullptr;
}

struct Loaded {
  Api api;
  std::string why;  // empty when usable
};

Loaded load() {
  Loaded out;
  std::string tried;
  void* driver = open_first({"libcuda.so.1", "libcuda.so"}, tried);
  if (driver == nullptr) {
    out.why = "no NVIDIA driver: could not load " + tried;
    return out;
  }
  std::string missing;
  Api& a = out.api;
#define LOOM_CUDA_RESOLVE(name) resolve(driver, LOOM_STRINGIFY_EXPANDED(name), a.name, missing);
  LOOM_CUDA_DRIVER_FUNCTIONS(LOOM_CUDA_RESOLVE)
#undef LOOM_CUDA_RESOLVE
  if (!missing.empty()) {
    out.why = "the NVIDIA driver lacks " + missing + " (Loom needs CUDA 11.2 or newer)";
    return out;
  }
  if (CUresult status = a.cuInit(0); status != CUDA_SUCCESS) {
    const char* name = nullptr;
    a.cuGetErrorName(status, &name);
    out.why =
        std::string("cuInit failed: ") + (name ? name : "unknown error") +
        (status == CUDA_ERROR_STUB_LIBRARY ? " (the toolkit's stub libcuda, not a driver)" : "");
    return out;
  }
  int devices = 0;
  if (a.cuDeviceGetCount(&devices) != CUDA_SUCCESS || devices == 0) {
    out.why = "the NVIDIA driver reports no CUDA device";
    return out;
  }
  tried.clear();
  void* cublas = open_first({"libcublas.so.13", "libcublas.so.12", "libcublas.so"}, tried);
  // Not on the loader's path: look where toolkits install it.
  std::vector<std::string> dirs;
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
    if (const char* root = std::getenv(var))
      dirs.push_back(std::string(root) + "/lib64");
  dirs.insert(dirs.end(), {"/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"});
  for (const std::string& dir : dirs) {
    for (const char* name : {"libcublas.so.13", "libcublas.so.12"}) {
      if (cublas != nullptr)
        break;
      std::string path = dir + "/" + name;
      cublas = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    }
  }
  if (cublas == nullptr) {
    out.why =
        "cuBLAS not found: could not load " + tried +
        " (add the folder holding libcublas.so.13 or .12 to LD_LIBRARY_PATH, or set CUDA_HOME)";
    return out;
  }
  resolve(cublas, "cublasCreate_v2", a.cublasCreate, missing);
  resolve(cublas, "cublasDestroy_v2", a.cublasDestroy, missing);
  resolve(cublas, "cublasSetStream_v2", a.cublasSetStream, missing);
  resolve(cublas, "cublasSetMathMode", a.cublasSetMathMode, missing);
  resolve(cublas, "cublasGemmStridedBatchedEx", a.cublasGemmStridedBatchedEx, missing);
  if (!missing.empty()) {
    out.why = "cuBLAS lacks " + missing;
    return out;
  }
  // cuBLASLt sits beside cuBLAS (which links it); without it, or without one of its
  // entry points, epilogues run as the GEMM and a kernel instead.
  void* lt = nullptr;
  std::vector<std::string> lt_dirs{""};  // "": the loader's path
  lt_dirs.insert(lt_dirs.end(), dirs.begin(), dirs.end());
  for (const std::string& dir : lt_dirs) {
    for (const char* name : {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"}) {
      if (lt != nullptr)
        break;
      std::string path = dir.empty() ? name : dir + "/" + name;
      lt = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    }
  }
  if (lt != nullptr) {
    Api with_lt = a;
    std::string lt_missing;
#define LOOM_CUBLASLT_RESOLVE(name) resolve(lt, #name, with_lt.name, lt_missing);
    LOOM_CUBLASLT_FUNCTIONS(LOOM_CUBLASLT_RESOLVE)
#undef LOOM_CUBLASLT_RESOLVE
    if (lt_missing.empty())
      a = with_lt;
  }
  return out;
}

}  // namespace

bool emulated() {
  static const bool on = [] {
    const char* env = std::getenv("LOOM_CUDA_EMULATOR");
    return env != nullptr && *env != '\0' && std::string(env) != "0";
  }();
  return on;
}

const Api* api(std::string* why) {
  if (emulated()) {
    if (why != nullptr)
      why->clear();
    return &emulator::api();
  }
  static const Loaded loaded = load();
  if (why != nullptr)
    *why = loaded.why;
  return loaded.why.empty() ? &loaded.api : nullptr;
}

void check_cu(CUresult status, const char* what) {
  if (status == CUDA_SUCCESS)
    return;
  const char* name = nullptr;
  const char* text = nullptr;
  if (const Api* a = api()) {
    a->cuGetErrorName(status, &name);
    a->cuGetErrorString(status, &text);
  }
  std::string detail = emulated() ? emulator::last_problem() : std::string();
  throw Error(std::string("cuda: ") + what + " failed: " + (name ? name : std::to_string(status)) +
              (text ? std::string(" (") + text + ")" : std::string()) +
              (detail.empty() ? "" : ": " + detail));
}

void check_cublas(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS)
    return;
  std::string detail = emulated() ? emulator::last_problem() : std::string();
  throw Error(std::string("cuda: ") + what + " failed with cuBLAS status " +
              std::to_string(static_cast<int>(status)) + (detail.empty() ? "" : ": " + detail));
}

}  // namespace loom::cuda
