// Batched paged attention: the kernels of lib/cuda/paged_batch_attention.cu, compiled for the host
// against the CUDA emulator (cuda_emu.h) and called through PagedBatchAttention, against the
// double-precision CPU reference. The cases and tolerances are those of the GPU test
// (tests/cuda/paged_batch_test_util.h): fp32 / bf16 / fp16, head dims 64/128/256 and odd ones
// (scalar loads), GQA ratios, block sizes 1/3/7/17, split-K over 5000-key contexts, head tiles,
// sliding windows, per-head slots with several key ranges, signals on and off, more signal rows
// than one signal-kernel batch, skip lists.
// Added here: caches at unaligned addresses (scalar loads), every thread schedule, random batches,
// and the negative control of the comparison.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "lib/cuda/paged_batch_attention.h"
#include "tests/cuda/paged_batch_test_util.h"
#include "tests/cuda_emu/cuda_emu.h"

namespace vtoken::cuda {
namespace {

using testing::BatchCase;
using testing::BatchOutputs;
using testing::BatchProblem;
using testing::BatchShape;
using testing::DtypeName;
using testing::HostArray;
using testing::Mismatch;
using testing::MixedSeqs;
using testing::SeqSpec;

// "Device" memory of the emulation: a copy of host bytes at a 256-byte aligned address (as
// cudaMalloc's) plus `offset` bytes.
class DeviceCopy {
 public:
  DeviceCopy(const void* data, size_t bytes, size_t offset = 0)
      : storage_(std::aligned_alloc(256, (bytes + offset + 256) / 256 * 256)),
        data_(static_cast<uint8_t*>(storage_.get()) + offset),
        bytes_(bytes) {
    if (bytes > 0) std::memcpy(data_, data, bytes);
  }
  template <typename T>
  explicit DeviceCopy(const std::vector<T>& host)
      : DeviceCopy(host.data(), host.size() * sizeof(T)) {}
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(data_);
  }
  void CopyTo(void* host) const { std::memcpy(host, data_, bytes_); }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> storage_;
  uint8_t* data_;
  size_t bytes_;
};

// What the emulated kernels wrote, and the launches they made.
struct KernelResult : BatchOutputs {
  std::vector<vtoken_emu::LaunchRecord> launches;
};

// Runs PagedBatchAttention on copies of `p`'s outputs and K/V (placed `kv_offset` bytes past an
// aligned address), with a workspace of NaN patterns: parts the kernels do not write must stay
// unread. `p` itself is left for the reference.
KernelResult RunEmulated(const BatchProblem& p, size_t kv_offset = 0) {
  DeviceCopy k(p.k.bytes.data(), p.k.bytes.size(), kv_offset);
  DeviceCopy v(p.v.bytes.data(), p.v.bytes.size(), kv_offset);
  DeviceCopy out(p.out.bytes), attn(p.attn_sum), norm(p.norm_sum);
  PagedBatchArgs d = p.args;
  d.k_cache = k.as<void>();
  d.v_cache = v.as<void>();
  d.out = out.as<void>();
  d.attn_sum = p.args.attn_sum != nullptr ? attn.as<float>() : nullptr;
  d.norm_sum = p.args.norm_sum != nullptr ? norm.as<float>() : nullptr;
  std::vector<uint8_t> workspace(PagedBatchWorkspaceBytes(d), 0xff);
  vtoken_emu::TakeLaunchLog();
  const Status status = PagedBatchAttention(d, workspace.data(), workspace.size(), nullptr);
  EXPECT_TRUE(status.ok()) << status.ToString();
  KernelResult result{{HostArray(p.out.dtype, p.out.size()), p.attn_sum, p.norm_sum},
                      vtoken_emu::TakeLaunchLog()};
  out.CopyTo(result.out.bytes.data());
  attn.CopyTo(result.attn_sum.data());
  norm.CopyTo(result.norm_sum.data());
  return result;
}

// Runs the emulated kernels on `p`, then the reference, and expects them to agree within the
// shared tolerances (Mismatches).
KernelResult ExpectKernelMatchesReference(BatchProblem& p, const std::string& label,
                                          float scale = 1.0f, size_t kv_offset = 0) {
  SCOPED_TRACE(label);
  KernelResult got = RunEmulated(p, kv_offset);
  const std::string failure = vtoken_emu::TakeLastFailure();
  EXPECT_EQ(failure, "");
  const Status status = PagedBatchAttentionReference(p.args);
  EXPECT_TRUE(status.ok()) << status.ToString();
  testing::ExpectNoMismatches(testing::Mismatches(p, got, scale));
  return got;
}

KernelResult ExpectKernelMatchesReference(const BatchCase& c) {
  SCOPED_TRACE("seed " + std::to_string(c.seed));
  BatchProblem p(c);
  return ExpectKernelMatchesReference(p, c.label, c.scale);
}

class PagedBatchEmuTest : public ::testing::TestWithParam<AttnDtype> {
 protected:
  void TearDown() override { vtoken_emu::SetSchedule(vtoken_emu::Schedule::kForward); }
};

INSTANTIATE_TEST_SUITE_P(Dtypes, PagedBatchEmuTest,
                         ::testing::Values(AttnDtype::kFloat32, AttnDtype::kBFloat16,
                                           AttnDtype::kFloat16),
                         [](const ::testing::TestParamInfo<AttnDtype>& info) {
                           return DtypeName(info.param);
                         });

TEST_P(PagedBatchEmuTest, MatchesReferenceOverShapesAndBlocks) {
  for (const BatchCase& c : testing::ShapeAndBlockCases(GetParam())) {
    ExpectKernelMatchesReference(c);
  }
}

// The main kernel's grid has one z slice per partition, and the merge kernel runs after it (one
// block per sequence and query row, a weight per head and partition in dynamic shared memory).
TEST_P(PagedBatchEmuTest, LongContextsSplitKeysAcrossPartitions) {
  const BatchCase c = testing::LongContextCase(GetParam());
  BatchProblem p(c);
  const int32_t partitions = PagedBatchPartitions(p.args);
  ASSERT_EQ(partitions, 19);  // min(264 / 6 CTAs, 32, 5000 keys / 256).
  const KernelResult got = ExpectKernelMatchesReference(p, c.label);
  ASSERT_EQ(got.launches.size(), 3u);  // Main, merge, signals.
  EXPECT_EQ(got.launches[0].grid.x, 3u * 2u);
  EXPECT_EQ(got.launches[0].grid.z, static_cast<unsigned>(partitions));
  EXPECT_EQ(got.launches[1].grid.y, 4u);
  EXPECT_EQ(got.launches[1].dynamic_shared_bytes, sizeof(float) * 8 * partitions);
}

TEST(PagedBatchEmuCaseTest, LargeScoresSplitAcrossPartitions) {
  const BatchCase c = testing::LargeScoresCase();
  BatchProblem p(c);
  ASSERT_GT(PagedBatchPartitions(p.args), 1);
  ExpectKernelMatchesReference(p, c.label, c.scale);
}

TEST(PagedBatchEmuCaseTest, LargeGqaGroupsSplitHeadsAcrossCtas) {
  for (const BatchCase& c : testing::LargeGqaCases()) ExpectKernelMatchesReference(c);
}

TEST_P(PagedBatchEmuTest, SlidingWindowAndPerHeadSlots) {
  for (const BatchCase& c : testing::SlidingWindowCases(GetParam())) {
    ExpectKernelMatchesReference(c);
  }
}

TEST(PagedBatchEmuCaseTest, SignalsOnOrOff) {
  for (const BatchCase& c : testing::SignalCases()) {
    const KernelResult got = ExpectKernelMatchesReference(c);
    // The signal kernel runs only for attn_sum and a want_signals list.
    const bool signal_kernel = c.shape.attn_signals && c.shape.want_signals_list;
    EXPECT_EQ(got.launches.size(), signal_kernel ? 2u : 1u) << c.label;
  }
}

// Signal rows past the signal kernel's batch of 64 (several row batches).
TEST(PagedBatchEmuCaseTest, LongPrefillSignalsTakeSeveralRowBatches) {
  for (const BatchCase& c : testing::LongPrefillSignalCases()) ExpectKernelMatchesReference(c);
}

// K/V one element past a 16-byte boundary: PagedBatchAttention gives the kernel scalar loads
// (paged_batch_attention.cc), which must agree with the vector loads' results.
TEST_P(PagedBatchEmuTest, UnalignedCachesTakeScalarLoads) {
  const AttnDtype t = GetParam();
  const size_t element = t == AttnDtype::kFloat32 ? 4 : 2;
  for (int32_t head_dim : {64, 256}) {
    BatchProblem aligned({.dtype = t, .num_heads = 8, .num_kv_heads = 2, .head_dim = head_dim},
                         MixedSeqs(1), 18);
    BatchProblem unaligned = aligned;
    unaligned.PointAtHost();
    const KernelResult vector_loads = ExpectKernelMatchesReference(aligned, "aligned");
    const KernelResult scalar_loads =
        ExpectKernelMatchesReference(unaligned, "unaligned", 1.0f, element);
    // Same products in the same order: only the loads differ.
    EXPECT_EQ(vector_loads.out.bytes, scalar_loads.out.bytes) << "head_dim " << head_dim;
  }
}

// The threads of a block run in forward, reverse and shuffled order between synchronization
// points: a missing barrier would make some order read stale or poisoned shared memory. The
// outputs involve no atomics, so they are bit-identical across the orders; the signal sums are
// fp32 atomics, whose order may differ.
TEST_P(PagedBatchEmuTest, EveryThreadScheduleGivesTheSameOutputs) {
  const AttnDtype t = GetParam();
  const uint64_t seed = 4242;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::vector<SeqSpec> seqs = MixedSeqs(1);
  seqs.push_back({.rows = 3, .context = {700}, .num_signal = 2});  // Split-K.
  BatchShape shape{.dtype = t,
                   .num_heads = 8,
                   .num_kv_heads = 2,
                   .head_dim = 24,
                   .block_size = 5,
                   .sliding_window = 40};
  std::vector<std::vector<uint8_t>> outs;
  for (vtoken_emu::Schedule schedule :
       {vtoken_emu::Schedule::kForward, vtoken_emu::Schedule::kReverse,
        vtoken_emu::Schedule::kShuffled}) {
    vtoken_emu::SetSchedule(schedule, seed);
    BatchProblem p(shape, seqs, seed);
    ASSERT_GT(PagedBatchPartitions(p.args), 1);
    outs.push_back(
        ExpectKernelMatchesReference(p, "schedule " + std::to_string(static_cast<int>(schedule)))
            .out.bytes);
  }
  EXPECT_EQ(outs[0], outs[1]);
  EXPECT_EQ(outs[0], outs[2]);
}

// Random shapes: any head_dim up to 256 (both kernel widths, vector and scalar loads), GQA ratios,
// block sizes, key ranges per sequence, windows, signal and skip mixes.
TEST(PagedBatchEmuRandomTest, RandomBatchesMatchReference) {
  const uint64_t seed = 20240613;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const AttnDtype dtypes[] = {AttnDtype::kFloat32, AttnDtype::kBFloat16, AttnDtype::kFloat16};
  for (int trial = 0; trial < 40; ++trial) {
    const int32_t kv_heads = static_cast<int32_t>(uniform(1, 3));
    const int64_t groups = uniform(1, 3);
    BatchShape shape{
        .dtype = dtypes[uniform(0, 2)],
        .num_heads = kv_heads * static_cast<int32_t>(uniform(1, 20)),
        .num_kv_heads = kv_heads,
        .head_dim = static_cast<int32_t>(uniform(0, 3) == 0 ? uniform(129, 256) : uniform(1, 128)),
        .block_size = uniform(1, 17),
        .groups_per_seq = groups,
        .per_head_slots = uniform(0, 1) == 1,
        .sliding_window = uniform(0, 1) == 1 ? uniform(1, 60) : 0,
        .attn_signals = uniform(0, 3) != 0,
        .norm_signals = uniform(0, 3) != 0};
    std::vector<SeqSpec> seqs(static_cast<size_t>(uniform(1, 4)));
    for (SeqSpec& s : seqs) {
      s.rows = uniform(1, 20);
      const int64_t longest = uniform(0, 5) == 0 ? 700 : 80;  // Some batches split keys.
      for (int64_t g = 0; g < groups; ++g) s.context.push_back(uniform(0, longest));
      s.num_signal = uniform(0, 25);
      s.want_signals = uniform(0, 3) != 0;
      s.skip = uniform(0, 6) == 0;
    }
    BatchProblem p(shape, seqs, rng());
    ExpectKernelMatchesReference(
        p, "trial " + std::to_string(trial) + ": " + DtypeName(shape.dtype) + " heads " +
               std::to_string(shape.num_heads) + "/" + std::to_string(kv_heads) + " head_dim " +
               std::to_string(shape.head_dim) + " partitions " +
               std::to_string(PagedBatchPartitions(p.args)));
  }
}

// The negative control: the comparison reports exactly the elements that differ.
TEST(PagedBatchEmuComparisonTest, ReportsEveryCorruptedElementAndNothingElse) {
  BatchProblem p({.dtype = AttnDtype::kBFloat16, .num_heads = 4, .num_kv_heads = 2, .head_dim = 16},
                 MixedSeqs(1), 19);
  KernelResult got = RunEmulated(p);
  ASSERT_TRUE(PagedBatchAttentionReference(p.args).ok());
  ASSERT_EQ(testing::Mismatches(p, got).size(), 0u);
  got.out.Set(37, got.out.Get(37) + 0.25f);
  got.attn_sum[5] += 1e-3f;
  got.norm_sum[9] = NAN;
  const std::vector<Mismatch> found = testing::Mismatches(p, got);
  ASSERT_EQ(found.size(), 3u);
  EXPECT_EQ(found[0].array, "out");
  EXPECT_EQ(found[0].index, 37u);
  EXPECT_EQ(found[1].array, "attn_sum");
  EXPECT_EQ(found[1].index, 5u);
  EXPECT_EQ(found[2].array, "norm_sum");
  EXPECT_EQ(found[2].index, 9u);
}

}  // namespace
}  // namespace vtoken::cuda
