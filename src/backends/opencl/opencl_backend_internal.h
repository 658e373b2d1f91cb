// backends/opencl/opencl_backend_internal.h — what the OpenCL backend's source files share:
// the error check of every OpenCL call, tensor addresses, kernel arguments and the kernel
// launchers. Not for use outside backends/opencl.
#pragma once

#include <string>
#include <string_view>

#include "backends/opencl/opencl_backend.h"
#include "core/error.h"

namespace loom::opencl::detail {

// Every OpenCL call of a launch passes through here: the message is built only on failure
// (built eagerly, it was a heap string per kernel argument).
inline void ok(cl_int status, std::string_view what) {
  if (status != CL_SUCCESS)
    throw Error("opencl: " + std::string(what) + " failed with error " + std::to_string(status));
}

inline cl_mem mem_of(const Tensor& t) {
  return static_cast<cl_mem>(t.storage()->data());
}
inline cl_ulong off_of(const Tensor& t) {
  return static_cast<cl_ulong>(t.offset());
}
inline void set_arg(cl_kernel k, cl_uint i, cl_mem v) {
  ok(clSetKernelArg(k, i, sizeof v, &v), "clSetKernelArg");
}
inline void set_arg(cl_kernel k, cl_uint i, cl_ulong v) {
  ok(clSetKernelArg(k, i, sizeof v, &v), "clSetKernelArg");
}
inline void set_arg(cl_kernel k, cl_uint i, cl_uint v) {
  ok(clSetKernelArg(k, i, sizeof v, &v), "clSetKernelArg");
}
inline void set_arg(cl_kernel k, cl_uint i, cl_int v) {
  ok(clSetKernelArg(k, i, sizeof v, &v), "clSetKernelArg");
}
inline void set_arg(cl_kernel k, cl_uint i, cl_float v) {
  ok(clSetKernelArg(k, i, sizeof v, &v), "clSetKernelArg");
}
inline std::size_t count(const Tensor& t) {
  return static_cast<std::size_t>(t.numel());
}

// A chain whose collapsed index space a generated kernel can walk (opencl_fusion.cpp).
bool fused_rank_fits(const OpCall& call);

}  // namespace loom::opencl::detail

namespace loom::opencl {

template <class... Args>
void OpenClBackend::run(const char* name, std::size_t global, Args... args) {
  if (global == 0)
    return;
  std::lock_guard lock(mutex_);
  cl_kernel k = kernel(name);
  cl_uint i = 0;
  (detail::set_arg(k, i++, args), ...);
  const cl_int err =
      clEnqueueNDRangeKernel(current_queue(), k, 1, nullptr, &global, nullptr, 0, nullptr, nullptr);
  if (err != CL_SUCCESS)
    detail::ok(err, std::string("clEnqueueNDRangeKernel ") + name);
}

template <class... Args>
void OpenClBackend::run_rows(const char* name, std::size_t columns, std::size_t rows,
                             Args... args) {
  if (columns == 0 || rows == 0)
    return;
  std::lock_guard lock(mutex_);
  cl_kernel k = kernel(name);
  cl_uint i = 0;
  (detail::set_arg(k, i++, args), ...);
  const std::size_t global[2] = {columns, rows};
  const cl_int err =
      clEnqueueNDRangeKernel(current_queue(), k, 2, nullptr, global, nullptr, 0, nullptr, nullptr);
  if (err != CL_SUCCESS)
    detail::ok(err, std::string("clEnqueueNDRangeKernel ") + name);
}

}  // namespace loom::opencl
