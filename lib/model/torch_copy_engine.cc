#include "lib/model/torch_copy_engine.h"

#include <xxhash.h>

namespace vtoken::model {

TorchCopyEngine::TorchCopyEngine(KvTensors& kv, bool async)
    : kv_(kv),
      async_(async),
      bytes_per_token_(2 * kv.options().num_layers * kv.options().num_kv_heads *
                       kv.options().head_dim * c10::elementSize(kv.options().dtype)) {
  if (async_) worker_ = std::thread([this] { Run(); });
}

TorchCopyEngine::~TorchCopyEngine() {
  if (!async_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_one();
  worker_.join();
}

void TorchCopyEngine::Copy(const std::vector<SlotCopy>& copies) {
  std::vector<int64_t> src, dst;
  src.reserve(copies.size());
  dst.reserve(copies.size());
  for (const SlotCopy& c : copies) {
    src.push_back(c.src);
    dst.push_back(c.dst);
  }
  Status s = kv_.CopySlots(src, dst);
  std::lock_guard<std::mutex> lock(mu_);
  if (!s.ok() && status_.ok()) status_ = s;
  bytes_ += static_cast<int64_t>(copies.size()) * bytes_per_token_;
}

CopyTicket TorchCopyEngine::Submit(std::vector<SlotCopy> copies) {
  if (!async_) {
    Copy(copies);
    std::lock_guard<std::mutex> lock(mu_);
    completed_ = next_;
    return next_++;
  }
  CopyTicket ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ticket = next_++;
    queue_.emplace_back(ticket, std::move(copies));
  }
  work_cv_.notify_one();
  return ticket;
}

void TorchCopyEngine::Wait(CopyTicket ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return completed_ >= ticket; });
}

bool TorchCopyEngine::Poll(CopyTicket ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_ >= ticket;
}

int64_t TorchCopyEngine::bytes_copied() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

Status TorchCopyEngine::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

void TorchCopyEngine::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;
    auto [ticket, copies] = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    Copy(copies);
    lock.lock();
    completed_ = ticket;
    done_cv_.notify_all();
  }
}

uint64_t TokenKvHash(KvTensors& kv, SlotIndex slot) {
  torch::NoGradGuard no_grad;
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  for (int64_t layer = 0; layer < kv.options().num_layers; ++layer) {
    for (const torch::Tensor* t : {&kv.k(layer), &kv.v(layer)}) {
      torch::Tensor row = (*t)[slot].to(torch::kCPU).contiguous();
      XXH64_update(state, row.data_ptr(), row.numel() * row.element_size());
    }
  }
  const uint64_t hash = XXH64_digest(state);
  XXH64_freeState(state);
  return hash;
}

}  // namespace vtoken::model
