#include "lib/model/torch_copy_engine.h"

#include <xxhash.h>

namespace vtoken::model {

TorchCopyEngine::TorchCopyEngine(KvTensors& kv, bool async)
    : QueuedCopyEngine([this, &kv](const std::vector<SlotCopy>& c) { return Copy(kv, c); }, async) {
}

int64_t TorchCopyEngine::Copy(KvTensors& kv, const std::vector<SlotCopy>& copies) {
  std::vector<int64_t> src, dst;
  src.reserve(copies.size());
  dst.reserve(copies.size());
  for (const SlotCopy& c : copies) {
    src.push_back(c.src);
    dst.push_back(c.dst);
  }
  Status s = kv.CopySlots(src, dst);
  if (!s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (status_.ok()) status_ = s;
    return 0;
  }
  return static_cast<int64_t>(copies.size()) * kv.bytes_per_slot();
}

Status TorchCopyEngine::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

uint64_t TokenKvHash(KvTensors& kv, SlotIndex slot) {
  torch::NoGradGuard no_grad;
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  for (size_t i = 0; i < kv.k_tensors().size(); ++i) {
    for (const torch::Tensor* t : {&kv.k_tensors()[i], &kv.v_tensors()[i]}) {
      torch::Tensor row = (*t)[slot].to(torch::kCPU).contiguous();
      XXH64_update(state, row.data_ptr(), row.numel() * row.element_size());
    }
  }
  const uint64_t hash = XXH64_digest(state);
  XXH64_freeState(state);
  return hash;
}

}  // namespace vtoken::model
