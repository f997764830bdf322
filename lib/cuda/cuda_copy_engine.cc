#include "lib/cuda/cuda_copy_engine.h"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "lib/cuda/cuda_check.h"
#include "lib/cuda/relocate.h"

namespace vtoken::cuda {

static_assert(sizeof(SlotCopy) == sizeof(SlotPair) &&
                  offsetof(SlotCopy, src) == offsetof(SlotPair, src) &&
                  offsetof(SlotCopy, dst) == offsetof(SlotPair, dst) &&
                  std::is_trivially_copyable_v<SlotCopy>,
              "the copy list is uploaded as raw bytes: SlotCopy and SlotPair must share a layout");

// One in-flight copy list: pinned host copy, device copy, and the event that completes it.
struct CudaCopyEngine::Staging {
  SlotPair* host = nullptr;  // Pinned, [capacity].
  DeviceBuffer device;       // [capacity] SlotPair.
  int64_t capacity = 0;
  cudaEvent_t done = nullptr;
};

namespace {

[[noreturn]] void Fatal(const char* method, const Status& status) {
  std::fprintf(stderr, "vtoken::cuda::CudaCopyEngine::%s: fatal: %s\n", method,
               status.ToString().c_str());
  std::abort();
}

void LogIfError(cudaError_t error, const char* what) {
  const Status status = CudaStatus(error, what);
  if (!status.ok())
    std::fprintf(stderr, "vtoken::cuda::CudaCopyEngine: %s\n", status.ToString().c_str());
}

}  // namespace

StatusOr<std::unique_ptr<CudaCopyEngine>> CudaCopyEngine::Create(
    std::span<void* const> k_layers, std::span<void* const> v_layers, int64_t num_slots,
    int64_t bytes_per_row, const CudaCopyEngineOptions& options) {
  if (k_layers.empty() || k_layers.size() != v_layers.size()) {
    return InvalidArgumentError(
        "CudaCopyEngine: need the same positive number of K and V layers, got " +
        std::to_string(k_layers.size()) + " and " + std::to_string(v_layers.size()));
  }
  for (size_t l = 0; l < k_layers.size(); ++l) {
    if (k_layers[l] == nullptr || v_layers[l] == nullptr) {
      return InvalidArgumentError("CudaCopyEngine: layer " + std::to_string(l) +
                                  " has a null K or V pointer");
    }
  }
  if (num_slots <= 0 || bytes_per_row <= 0 || options.initial_staging_copies <= 0) {
    return InvalidArgumentError(
        "CudaCopyEngine: num_slots, bytes_per_row and initial_staging_copies must be positive");
  }
  const size_t num_layers = k_layers.size();
  std::vector<void*> pointers(k_layers.begin(), k_layers.end());
  pointers.insert(pointers.end(), v_layers.begin(), v_layers.end());
  VTOKEN_ASSIGN_OR_RETURN(DeviceBuffer layer_pointers,
                          DeviceBuffer::Allocate(pointers.size() * sizeof(void*)));
  VTOKEN_RETURN_IF_ERROR(
      layer_pointers.CopyFromHost(pointers.data(), pointers.size() * sizeof(void*)));
  KvLayersView view;
  view.k_layers = layer_pointers.as<void*>();
  view.v_layers = layer_pointers.as<void*>() + num_layers;
  view.num_layers = static_cast<int32_t>(num_layers);
  view.num_slots = num_slots;
  view.bytes_per_row = bytes_per_row;
  VTOKEN_ASSIGN_OR_RETURN(CudaStream copy_stream, CudaStream::Create());
  std::unique_ptr<CudaCopyEngine> engine(
      new CudaCopyEngine(options, std::move(layer_pointers), view, std::move(copy_stream)));
  VTOKEN_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&engine->compute_ready_, cudaEventDisableTiming));
  return engine;
}

CudaCopyEngine::CudaCopyEngine(const CudaCopyEngineOptions& options, DeviceBuffer layer_pointers,
                               const KvLayersView& view, CudaStream copy_stream)
    : options_(options),
      layer_pointers_(std::move(layer_pointers)),
      view_(view),
      copy_stream_(std::move(copy_stream)) {}

CudaCopyEngine::~CudaCopyEngine() {
  LogIfError(cudaStreamSynchronize(copy_stream_.get()), "cudaStreamSynchronize(copy stream)");
  for (const std::unique_ptr<Staging>& staging : staging_) {
    if (staging->host != nullptr) LogIfError(cudaFreeHost(staging->host), "cudaFreeHost");
    if (staging->done != nullptr) LogIfError(cudaEventDestroy(staging->done), "cudaEventDestroy");
  }
  if (compute_ready_ != nullptr) LogIfError(cudaEventDestroy(compute_ready_), "cudaEventDestroy");
}

CopyTicket CudaCopyEngine::Submit(std::vector<SlotCopy> copies) {
  StatusOr<CopyTicket> ticket = TrySubmit(copies);
  if (!ticket.ok()) Fatal("Submit", ticket.status());
  return *ticket;
}

void CudaCopyEngine::Wait(CopyTicket ticket) {
  const Status status = TryWait(ticket);
  if (!status.ok()) Fatal("Wait", status);
}

bool CudaCopyEngine::FenceConsumer(CopyTicket ticket) {
  const Status status = MakeStreamWait(ticket, options_.compute_stream);
  if (!status.ok()) Fatal("FenceConsumer", status);
  return true;
}

bool CudaCopyEngine::Poll(CopyTicket ticket) {
  StatusOr<bool> done = TryPoll(ticket);
  if (!done.ok()) Fatal("Poll", done.status());
  return *done;
}

Status CudaCopyEngine::ValidateCopies(std::span<const SlotCopy> copies) const {
  for (size_t i = 0; i < copies.size(); ++i) {
    const SlotCopy& c = copies[i];
    if (c.src < 0 || c.src >= view_.num_slots || c.dst < 0 || c.dst >= view_.num_slots) {
      return InvalidArgumentError("CudaCopyEngine: copy " + std::to_string(i) + " (" +
                                  std::to_string(c.src) + " -> " + std::to_string(c.dst) +
                                  ") is out of range [0, " + std::to_string(view_.num_slots) + ")");
    }
  }
  // The kernel copies rows in no particular order, so the list must not depend on one.
  std::vector<SlotIndex> srcs(copies.size());
  std::vector<SlotIndex> dsts(copies.size());
  for (size_t i = 0; i < copies.size(); ++i) {
    srcs[i] = copies[i].src;
    dsts[i] = copies[i].dst;
  }
  std::sort(srcs.begin(), srcs.end());
  std::sort(dsts.begin(), dsts.end());
  for (size_t i = 0; i < dsts.size(); ++i) {
    if (i > 0 && dsts[i] == dsts[i - 1]) {
      return InvalidArgumentError("CudaCopyEngine: slot " + std::to_string(dsts[i]) +
                                  " is the destination of two copies");
    }
    if (std::binary_search(srcs.begin(), srcs.end(), dsts[i])) {
      return InvalidArgumentError("CudaCopyEngine: slot " + std::to_string(dsts[i]) +
                                  " is both a source and a destination");
    }
  }
  return Status::Ok();
}

Status CudaCopyEngine::CheckTicket(CopyTicket ticket) const {
  if (ticket == 0 || ticket >= next_ticket_) {
    return InvalidArgumentError(
        "CudaCopyEngine: ticket " + std::to_string(ticket) +
        " was never issued (last issued: " + std::to_string(next_ticket_ - 1) + ")");
  }
  return Status::Ok();
}

Status CudaCopyEngine::Fail(Status status) {
  if (failure_.ok()) failure_ = status;
  return status;
}

StatusOr<CudaCopyEngine::Staging*> CudaCopyEngine::AcquireStaging(int64_t num_copies) {
  // The smallest free buffer that holds the list. None is ever freed or resized here: cudaFree
  // and cudaFreeHost synchronise the device, which would stall the forward pass that this copy
  // is meant to overlap. A longer list gets a new buffer (a power of two), and the small ones
  // stay for later short lists; all are released by the destructor.
  auto best = free_staging_.end();
  for (auto it = free_staging_.begin(); it != free_staging_.end(); ++it) {
    if ((*it)->capacity >= num_copies &&
        (best == free_staging_.end() || (*it)->capacity < (*best)->capacity)) {
      best = it;
    }
  }
  if (best != free_staging_.end()) {
    Staging* staging = *best;
    free_staging_.erase(best);
    return staging;
  }
  auto staging = std::make_unique<Staging>();
  VTOKEN_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&staging->done, cudaEventDisableTiming));
  const int64_t capacity =
      std::max<int64_t>(std::bit_ceil(static_cast<uint64_t>(std::max<int64_t>(num_copies, 1))),
                        options_.initial_staging_copies);
  const size_t bytes = static_cast<size_t>(capacity) * sizeof(SlotPair);
  const cudaError_t error = cudaMallocHost(reinterpret_cast<void**>(&staging->host), bytes);
  if (error != cudaSuccess) {
    LogIfError(cudaEventDestroy(staging->done), "cudaEventDestroy");
    return CudaStatus(error, "cudaMallocHost(copy list)");
  }
  StatusOr<DeviceBuffer> device = DeviceBuffer::Allocate(bytes);
  if (!device.ok()) {
    LogIfError(cudaFreeHost(staging->host), "cudaFreeHost");
    LogIfError(cudaEventDestroy(staging->done), "cudaEventDestroy");
    return device.status();
  }
  staging->device = std::move(*device);
  staging->capacity = capacity;
  staging_.push_back(std::move(staging));
  return staging_.back().get();
}

StatusOr<CopyTicket> CudaCopyEngine::TrySubmit(std::span<const SlotCopy> copies) {
  if (!failure_.ok()) return failure_;
  VTOKEN_RETURN_IF_ERROR(ValidateCopies(copies));
  // Recycles the staging buffers of tickets that have finished meanwhile.
  if (Status status = Retire(0, /*block=*/false); !status.ok()) return Fail(status);
  const int64_t n = static_cast<int64_t>(copies.size());
  StatusOr<Staging*> acquired = AcquireStaging(n);
  if (!acquired.ok()) return Fail(acquired.status());
  Staging* staging = *acquired;
  cudaStream_t stream = copy_stream_.get();
  Status status = CudaStatus(cudaEventRecord(compute_ready_, options_.compute_stream),
                             "cudaEventRecord(compute stream)");
  if (status.ok()) {
    status = CudaStatus(cudaStreamWaitEvent(stream, compute_ready_, 0),
                        "cudaStreamWaitEvent(copy stream)");
  }
  if (status.ok() && n > 0) {
    std::memcpy(static_cast<void*>(staging->host), copies.data(), n * sizeof(SlotPair));
    status = CudaStatus(cudaMemcpyAsync(staging->device.data(), staging->host, n * sizeof(SlotPair),
                                        cudaMemcpyHostToDevice, stream),
                        "cudaMemcpyAsync(copy list)");
    if (status.ok()) status = RelocateRows(view_, staging->device.as<SlotPair>(), n, stream);
  }
  if (status.ok())
    status = CudaStatus(cudaEventRecord(staging->done, stream), "cudaEventRecord(copy stream)");
  if (!status.ok()) return Fail(status);
  const CopyTicket ticket = next_ticket_++;
  in_flight_.push_back({ticket, n * view_.num_layers * 2 * view_.bytes_per_row, staging});
  return ticket;
}

Status CudaCopyEngine::Retire(CopyTicket ticket, bool block) {
  while (!in_flight_.empty()) {
    InFlight& front = in_flight_.front();
    if (block && front.ticket <= ticket) {
      VTOKEN_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(front.staging->done));
    } else {
      const cudaError_t query = cudaEventQuery(front.staging->done);
      if (query == cudaErrorNotReady) return Status::Ok();
      VTOKEN_CUDA_RETURN_IF_ERROR(query);
    }
    completed_ = front.ticket;
    bytes_copied_ += front.bytes;
    free_staging_.push_back(front.staging);
    in_flight_.pop_front();
  }
  return Status::Ok();
}

Status CudaCopyEngine::TryWait(CopyTicket ticket) {
  VTOKEN_RETURN_IF_ERROR(CheckTicket(ticket));
  if (!failure_.ok()) return failure_;
  if (ticket <= completed_) return Status::Ok();
  if (Status status = Retire(ticket, /*block=*/true); !status.ok()) return Fail(status);
  return Status::Ok();
}

StatusOr<bool> CudaCopyEngine::TryPoll(CopyTicket ticket) {
  VTOKEN_RETURN_IF_ERROR(CheckTicket(ticket));
  if (!failure_.ok()) return failure_;
  if (ticket <= completed_) return true;
  if (Status status = Retire(ticket, /*block=*/false); !status.ok()) return Fail(status);
  return ticket <= completed_;
}

Status CudaCopyEngine::MakeStreamWait(CopyTicket ticket, Stream stream) {
  VTOKEN_RETURN_IF_ERROR(CheckTicket(ticket));
  if (!failure_.ok()) return failure_;
  if (ticket <= completed_) return Status::Ok();
  for (const InFlight& entry : in_flight_) {
    if (entry.ticket != ticket) continue;
    // cudaStreamWaitEvent captures the event's current record, so recycling the staging later
    // (re-recording its event) does not affect this wait.
    Status status = CudaStatus(cudaStreamWaitEvent(stream, entry.staging->done, 0),
                               "cudaStreamWaitEvent(compute stream)");
    if (!status.ok()) return Fail(status);
    return Status::Ok();
  }
  return InternalError("CudaCopyEngine: ticket " + std::to_string(ticket) +
                       " is neither completed nor in flight");
}

}  // namespace vtoken::cuda
