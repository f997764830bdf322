// StepUpload (lib/model/step_upload.h): the segments of a paged step's one upload land at the
// offsets Add / AddBytes returned, byte segments zero-padded to whole words, and Send copies the
// values when it runs (so later changes to a source do not leak into a sent tensor). The device
// side is CudaAttentionTest's (llama_cuda_attention_test.cc): every ForwardPaged step on CUDA
// reads its inputs from one Send.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <vector>

#include "lib/model/step_upload.h"

namespace vtoken::model::internal {
namespace {

std::vector<int64_t> Values(const torch::Tensor& t) {
  const torch::Tensor host = t.cpu().contiguous();
  return {host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel()};
}

struct Packed {
  StepUpload upload;
  std::vector<int64_t> a = {5, -1, 7};
  std::vector<int64_t> empty;
  std::vector<int64_t> b = {1LL << 40};
  std::vector<uint8_t> bytes = {1, 0, 3, 0, 0, 0, 0, 0, 9};  // 9 bytes: two words.
  int64_t a_at = -1, empty_at = -1, bytes_at = -1, b_at = -1;

  Packed() {
    a_at = upload.Add(a);
    empty_at = upload.Add(empty);
    bytes_at = upload.AddBytes(bytes.data(), static_cast<int64_t>(bytes.size()));
    b_at = upload.Add(b);
  }

  void ExpectLaidOut(const std::vector<int64_t>& got) const {
    EXPECT_EQ(a_at, 0);
    EXPECT_EQ(empty_at, 3);  // An empty segment takes no room.
    EXPECT_EQ(bytes_at, 3);
    EXPECT_EQ(b_at, 5);
    ASSERT_EQ(got.size(), 6u);
    EXPECT_EQ(std::vector<int64_t>(got.begin(), got.begin() + 3), a);
    uint8_t words[16];
    std::memcpy(words, got.data() + bytes_at, sizeof(words));
    for (size_t i = 0; i < sizeof(words); ++i) {
      EXPECT_EQ(words[i], i < bytes.size() ? bytes[i] : 0) << "byte " << i;
    }
    EXPECT_EQ(got[5], 1LL << 40);
  }
};

TEST(StepUploadTest, SegmentsLandAtTheirOffsetsOnTheCpu) {
  Packed p;
  EXPECT_EQ(p.upload.size(), 6);
  const torch::Tensor sent = p.upload.Send(torch::kCPU);
  EXPECT_EQ(sent.scalar_type(), torch::kInt64);
  EXPECT_TRUE(sent.is_cpu());
  p.ExpectLaidOut(Values(sent));
  p.a[0] = 99;  // Send has copied: the sent tensor keeps the value it had.
  EXPECT_EQ(Values(sent)[0], 5);
  EXPECT_EQ(Values(p.upload.Send(torch::kCPU))[0], 99);
}

TEST(StepUploadTest, NothingAddedSendsAnEmptyTensor) {
  StepUpload upload;
  EXPECT_EQ(upload.Send(torch::kCPU).numel(), 0);
}

}  // namespace
}  // namespace vtoken::model::internal
