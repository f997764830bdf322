// Device plumbing shared by the kernels' launchers, the copy engine, tests and benchmarks: the
// device probe, opaque stream handles, and RAII owners of device memory and streams whose every
// CUDA call reports failure as a vtoken::Status.
//
// This header needs no CUDA headers: streams are the runtime's own opaque pointer type, declared
// here the same way cuda_runtime_api.h declares it, so plain C++ translation units can use it.
//
// Thread safety: a DeviceBuffer or CudaStream is thread-compatible (one owner at a time).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "lib/core/status.h"

struct CUstream_st;  // The CUDA runtime's opaque stream type (cudaStream_t is CUstream_st*).

namespace vtoken::cuda {

// A CUDA stream handle; nullptr is the legacy default stream.
using Stream = CUstream_st*;

// Returns OK when at least one CUDA device is usable, else FailedPrecondition naming why
// ("no CUDA device: <runtime error>"). Tests use it to GTEST_SKIP on machines without a GPU.
Status CudaDeviceStatus();
// Shorthand for CudaDeviceStatus().ok().
bool CudaDeviceAvailable();

// "<name> (sm_XY, N SMs, M MiB)" of the current device, or the error.
StatusOr<std::string> CudaDeviceDescription();

// Free and total bytes of CUDA device `device` (cudaMemGetInfo, which creates the device's
// context if it has none); the current device is left as it was. FailedPrecondition without a
// device, InvalidArgument for an index beyond them.
struct DeviceMemory {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};
StatusOr<DeviceMemory> CudaMemoryInfo(int device);

// Enqueues a one-thread kernel that keeps `stream` busy for about `microseconds` (tests and
// benchmarks delay a stream with it to widen a race window). InvalidArgument for a negative
// time, Internal when the launch fails.
Status SpinStream(Stream stream, int64_t microseconds);

// Owns `bytes` of device memory (cudaMalloc). Movable, not copyable.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Allocates `bytes` (0 allowed: data() is then null). Returns ResourceExhausted when the
  // device is out of memory, Internal on any other CUDA error.
  static StatusOr<DeviceBuffer> Allocate(size_t bytes);

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return bytes_; }

  // Synchronous copies between this buffer (from byte `offset`) and host memory.
  // REQUIRES: offset + bytes <= size().
  Status CopyFromHost(const void* host, size_t bytes, size_t offset = 0);
  Status CopyToHost(void* host, size_t bytes, size_t offset = 0) const;
  // Fills the whole buffer with `byte` (synchronous).
  Status Fill(uint8_t byte);

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Owns a non-blocking CUDA stream (it does not synchronize with the legacy default stream).
class CudaStream {
 public:
  CudaStream() = default;
  ~CudaStream();
  CudaStream(CudaStream&& other) noexcept;
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  static StatusOr<CudaStream> Create();
  Stream get() const { return stream_; }
  // Blocks the host until all work queued on the stream has finished.
  Status Synchronize() const;

 private:
  Stream stream_ = nullptr;
};

}  // namespace vtoken::cuda
