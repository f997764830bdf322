#include "lib/cuda/device.h"

#include <cstdio>
#include <utility>

#include "lib/cuda/cuda_check.h"
#include "lib/cuda/kernels.h"

namespace vtoken::cuda {

Status CudaDeviceStatus() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    // The probe must not leave a sticky error behind for the next unrelated call.
    cudaGetLastError();
    return FailedPreconditionError(std::string("no CUDA device: ") + cudaGetErrorName(error) +
                                   ": " + cudaGetErrorString(error));
  }
  if (count == 0) return FailedPreconditionError("no CUDA device: device count is 0");
  return Status::Ok();
}

bool CudaDeviceAvailable() { return CudaDeviceStatus().ok(); }

Status SpinStream(Stream stream, int64_t microseconds) {
  if (microseconds < 0) {
    return InvalidArgumentError("SpinStream: negative time " + std::to_string(microseconds));
  }
  return CudaStatus(internal::LaunchSpin(microseconds, stream), "SpinStream launch");
}

StatusOr<std::string> CudaDeviceDescription() {
  int device = 0;
  VTOKEN_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  VTOKEN_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
  char text[512];
  std::snprintf(text, sizeof(text), "%s (sm_%d%d, %d SMs, %zu MiB)", prop.name, prop.major,
                prop.minor, prop.multiProcessorCount, prop.totalGlobalMem >> 20);
  return std::string(text);
}

StatusOr<DeviceMemory> CudaMemoryInfo(int device) {
  VTOKEN_RETURN_IF_ERROR(CudaDeviceStatus());
  int count = 0, current = 0;
  VTOKEN_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (device < 0 || device >= count) {
    return InvalidArgumentError("CUDA device " + std::to_string(device) + ": " +
                                std::to_string(count) + " visible");
  }
  VTOKEN_CUDA_RETURN_IF_ERROR(cudaGetDevice(&current));
  VTOKEN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  size_t free_bytes = 0, total_bytes = 0;
  const cudaError_t error = cudaMemGetInfo(&free_bytes, &total_bytes);
  VTOKEN_CUDA_RETURN_IF_ERROR(cudaSetDevice(current));
  VTOKEN_RETURN_IF_ERROR(CudaStatus(error, "cudaMemGetInfo"));
  return DeviceMemory{.free_bytes = static_cast<int64_t>(free_bytes),
                      .total_bytes = static_cast<int64_t>(total_bytes)};
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) {
    const Status status = CudaStatus(cudaFree(data_), "cudaFree");
    if (!status.ok())
      std::fprintf(stderr, "vtoken::cuda::DeviceBuffer: %s\n", status.ToString().c_str());
  }
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    DeviceBuffer old(std::move(*this));
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  DeviceBuffer buffer;
  if (bytes > 0) {
    VTOKEN_CUDA_RETURN_IF_ERROR(cudaMalloc(&buffer.data_, bytes));
  }
  buffer.bytes_ = bytes;
  return buffer;
}

Status DeviceBuffer::CopyFromHost(const void* host, size_t bytes, size_t offset) {
  if (offset + bytes > bytes_) {
    return InvalidArgumentError("DeviceBuffer::CopyFromHost: " + std::to_string(offset + bytes) +
                                " bytes exceed the buffer's " + std::to_string(bytes_));
  }
  if (bytes == 0) return Status::Ok();
  VTOKEN_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(static_cast<char*>(data_) + offset, host, bytes, cudaMemcpyHostToDevice));
  return Status::Ok();
}

Status DeviceBuffer::CopyToHost(void* host, size_t bytes, size_t offset) const {
  if (offset + bytes > bytes_) {
    return InvalidArgumentError("DeviceBuffer::CopyToHost: " + std::to_string(offset + bytes) +
                                " bytes exceed the buffer's " + std::to_string(bytes_));
  }
  if (bytes == 0) return Status::Ok();
  VTOKEN_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(host, static_cast<const char*>(data_) + offset, bytes, cudaMemcpyDeviceToHost));
  return Status::Ok();
}

Status DeviceBuffer::Fill(uint8_t byte) {
  if (bytes_ == 0) return Status::Ok();
  VTOKEN_CUDA_RETURN_IF_ERROR(cudaMemset(data_, byte, bytes_));
  return Status::Ok();
}

CudaStream::~CudaStream() {
  if (stream_ != nullptr) {
    const Status status = CudaStatus(cudaStreamDestroy(stream_), "cudaStreamDestroy");
    if (!status.ok())
      std::fprintf(stderr, "vtoken::cuda::CudaStream: %s\n", status.ToString().c_str());
  }
}

CudaStream::CudaStream(CudaStream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)) {}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    CudaStream old(std::move(*this));
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

StatusOr<CudaStream> CudaStream::Create() {
  CudaStream stream;
  VTOKEN_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream.stream_, cudaStreamNonBlocking));
  return stream;
}

Status CudaStream::Synchronize() const {
  VTOKEN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status::Ok();
}

}  // namespace vtoken::cuda
