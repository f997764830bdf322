#include "lib/model/step_upload.h"

#include <algorithm>
#include <cstring>

namespace vtoken::model::internal {

int64_t StepUpload::Add(const int64_t* data, int64_t count) {
  const int64_t at = size_;
  if (count > 0) segments_.push_back({data, count});
  size_ += count;
  return at;
}

int64_t StepUpload::AddBytes(const uint8_t* data, int64_t count) {
  std::vector<int64_t>& words = owned_.emplace_back(static_cast<size_t>((count + 7) / 8), 0);
  if (count > 0) std::memcpy(words.data(), data, static_cast<size_t>(count));
  return Add(words);
}

torch::Tensor StepUpload::Send(const torch::Device& device) const {
  auto host_options = torch::TensorOptions().dtype(torch::kInt64);
  if (device.is_cuda()) host_options = host_options.pinned_memory(true);
  torch::Tensor host = torch::empty({size_}, host_options);
  int64_t* p = host.data_ptr<int64_t>();
  for (const Segment& s : segments_) p = std::copy(s.data, s.data + s.count, p);
  return device.is_cpu() ? host : host.to(device, /*non_blocking=*/true);
}

}  // namespace vtoken::model::internal
