// Device and dtype of the torch runtime: names resolved against this libtorch (a one-line error
// when CUDA is asked for and absent), the dtype probe agreeing with what a forward does, synthetic
// weights drawn on the device from the seed, and naive = vtoken tokens in bfloat16. CUDA cases
// skip without a device.
#include "lib/model/torch_device.h"

#include <gtest/gtest.h>

#include <array>
#include <string>

#include "lib/engine/engine.h"
#include "lib/model/llama_runner.h"
#include "tests/model/small_model_config.h"

namespace vtoken::model {
namespace {

using test_configs::SmallConfig;

LlamaOptions Options(torch::Device device, torch::Dtype dtype) {
  LlamaOptions o;
  o.device = device;
  o.compute_dtype = dtype;
  return o;
}

TEST(TorchDeviceTest, ParsesCpuAndRejectsMalformedNames) {
  StatusOr<torch::Device> cpu = TorchDevice("cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  EXPECT_TRUE(cpu->is_cpu());
  for (const char* bad : {"tpu", "cuda:", "cuda:x", "gpu"}) {
    StatusOr<torch::Device> d = TorchDevice(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(d.status().message(),
              "device \"" + std::string(bad) + "\": must be \"cpu\", \"cuda\" or \"cuda:N\"");
  }
}

TEST(TorchDeviceTest, CudaWithoutADeviceIsFailedPrecondition) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "this machine has a CUDA device";
    // The build knows whether it linked a libtorch with CUDA (lib/model/CMakeLists.txt).
#ifdef VTOKEN_TORCH_CUDA
  const bool cuda_libtorch = true;
#else
  const bool cuda_libtorch = false;
#endif
  EXPECT_EQ(LibtorchHasCuda(), cuda_libtorch);
  const std::string why =
      cuda_libtorch ? "no GPU is visible to this process" : "this libtorch was built without CUDA";
  for (const std::string name : {"cuda", "cuda:0", "cuda:7"}) {
    StatusOr<torch::Device> d = TorchDevice(name);
    ASSERT_FALSE(d.ok()) << name;
    EXPECT_EQ(d.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(d.status().message(), "device \"" + name + "\": no CUDA device (" + why + ")");
  }
  StatusOr<LlamaOptions> options = LlamaOptionsFor("cuda", "bfloat16");
  ASSERT_FALSE(options.ok());
  EXPECT_EQ(options.status().code(), StatusCode::kFailedPrecondition);
}

TEST(TorchDeviceTest, CudaIndexBeyondTheDevicesIsInvalidArgument) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const int count = static_cast<int>(torch::cuda::device_count());
  StatusOr<torch::Device> last = TorchDevice("cuda:" + std::to_string(count - 1));
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_TRUE(last->is_cuda());
  EXPECT_EQ(last->index(), count - 1);
  StatusOr<torch::Device> beyond = TorchDevice("cuda:" + std::to_string(count));
  ASSERT_FALSE(beyond.ok());
  EXPECT_EQ(beyond.status().code(), StatusCode::kInvalidArgument);
}

// "cuda" resolves to the current device's index: a tensor made there reports that index, and
// Device's == compares indexes, so an unresolved "cuda" would differ from every CUDA tensor.
TEST(TorchDeviceTest, CudaWithoutAnIndexIsTheCurrentDevice) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  StatusOr<torch::Device> d = TorchDevice("cuda");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_TRUE(d->is_cuda());
  EXPECT_GE(d->index(), 0);
  EXPECT_EQ(torch::zeros({1}, torch::TensorOptions().device(torch::kCUDA)).device(), *d);
}

TEST(TorchDeviceTest, DtypeNames) {
  EXPECT_EQ(*TorchDtype("float32"), torch::kFloat32);
  EXPECT_EQ(*TorchDtype("bfloat16"), torch::kBFloat16);
  EXPECT_EQ(*TorchDtype("float16"), torch::kFloat16);
  EXPECT_EQ(TorchDtype("fp16").status().message(),
            "dtype \"fp16\": must be \"float32\", \"bfloat16\" or \"float16\"");
  for (const char* name : {"float32", "bfloat16", "float16"}) {
    EXPECT_EQ(TorchDtypeName(*TorchDtype(name)), name);
  }
  StatusOr<LlamaOptions> o = LlamaOptionsFor("cpu", "bfloat16");
  ASSERT_TRUE(o.ok());
  EXPECT_TRUE(o->device.is_cpu());
  EXPECT_EQ(o->compute_dtype, torch::kBFloat16);
}

// Whether a paged prefill + decode runs in `options`, found by running it.
bool ForwardRuns(const LlamaOptions& options) {
  try {
    StatusOr<LlamaModel> m = LlamaModel::RandomInit(SmallConfig(), 5, options);
    if (!m.ok()) return false;
    StatusOr<KvTensors> kv = KvTensors::Create(m->KvOptions(64));
    if (!kv.ok()) return false;
    PagedSeqInput prefill;
    prefill.tokens = {1, 5, 9, 13, 17, 21, 25};
    prefill.positions = {0, 1, 2, 3, 4, 5, 6};
    prefill.write_slots = prefill.positions;
    if (!m->ForwardPaged({prefill}, *kv).ok()) return false;
    PagedSeqInput decode;
    decode.tokens = {3};
    decode.positions = {7};
    decode.write_slots = {40};
    decode.context_slots = prefill.positions;
    return m->ForwardPaged({decode}, *kv).ok();
  } catch (const c10::Error&) {
    return false;
  }
}

TEST(TorchDeviceTest, ProbeAgreesWithAForwardOnTheCpu) {
  EXPECT_TRUE(CheckDtypeRuns(Options(torch::kCPU, torch::kFloat32)).ok());
  Status bf16 = CheckDtypeRuns(Options(torch::kCPU, torch::kBFloat16));
  EXPECT_TRUE(bf16.ok()) << bf16.ToString();
  for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    const LlamaOptions o = Options(torch::kCPU, dtype);
    const Status probe = CheckDtypeRuns(o);
    EXPECT_EQ(probe.ok(), ForwardRuns(o)) << TorchDtypeName(dtype) << ": " << probe.ToString();
    if (probe.ok()) continue;
    EXPECT_EQ(probe.code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(
        probe.message().rfind(
            "dtype " + TorchDtypeName(dtype) + " on cpu: not supported by this libtorch (", 0),
        0u)
        << probe.message();
    EXPECT_EQ(probe.message().find('\n'), std::string::npos) << probe.message();
    // LoadModel refuses it before touching the model (the directory does not exist).
    StatusOr<LlamaModel> loaded = LoadModel("/nonexistent/model-dir", 1, o);
    ASSERT_FALSE(loaded.ok());
    EXPECT_EQ(loaded.status().message(), probe.message());
  }
}

std::vector<torch::Tensor> Weights(const LlamaModel& m) {
  std::vector<torch::Tensor> out;
  for (const auto& [name, t] : m.NamedParameters()) out.push_back(t);
  return out;
}

// Same seed, same weights; another seed, other weights; bf16 = the fp32 weights rounded; all on
// `device`.
void ExpectSeededWeightsOn(torch::Device device) {
  const ModelConfig c = SmallConfig();
  StatusOr<LlamaModel> a = LlamaModel::RandomInit(c, 11, Options(device, torch::kFloat32));
  StatusOr<LlamaModel> b = LlamaModel::RandomInit(c, 11, Options(device, torch::kFloat32));
  StatusOr<LlamaModel> other = LlamaModel::RandomInit(c, 12, Options(device, torch::kFloat32));
  StatusOr<LlamaModel> bf16 = LlamaModel::RandomInit(c, 11, Options(device, torch::kBFloat16));
  ASSERT_TRUE(a.ok() && b.ok() && other.ok() && bf16.ok());
  const std::vector<torch::Tensor> wa = Weights(*a), wb = Weights(*b), wo = Weights(*other),
                                   wh = Weights(*bf16);
  ASSERT_EQ(wa.size(), wh.size());
  for (size_t i = 0; i < wa.size(); ++i) {
    EXPECT_EQ(wa[i].device(), device);
    EXPECT_EQ(wh[i].device(), device);
    EXPECT_EQ(wh[i].scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::equal(wa[i], wb[i])) << "tensor " << i;
    EXPECT_TRUE(torch::equal(wa[i].to(torch::kBFloat16), wh[i])) << "tensor " << i;
  }
  EXPECT_FALSE(torch::equal(wa[0], wo[0]));  // The embedding: random in both.
}

TEST(TorchDeviceTest, SyntheticWeightsAreSeededOnTheCpu) {
  ExpectSeededWeightsOn(torch::kCPU);
  // The CPU draw is the one earlier versions made (one CPU generator, embedding first), so
  // synthetic models keep their weights.
  StatusOr<LlamaModel> m = LlamaModel::RandomInit(SmallConfig(), 11);
  ASSERT_TRUE(m.ok());
  auto gen = at::detail::createCPUGenerator(11);
  EXPECT_TRUE(torch::equal(
      Weights(*m)[0], at::normal(0.0, 0.02, {97, 48}, gen, torch::TensorOptions(torch::kFloat32))));
}

TEST(TorchDeviceTest, SyntheticWeightsAreSeededOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  ExpectSeededWeightsOn(torch::Device(torch::kCUDA, 0));
}

// `device_hashes`: the runner's [device_hash_calls, device_hash_failures].
StatusOr<engine::EngineResult> RunMode(Mode mode, const LlamaOptions& options,
                                       Granularity granularity, std::string* copy_engine,
                                       std::array<int64_t, 2>* device_hashes) {
  const ModelConfig c = SmallConfig();
  const int32_t groups = NumKvGroups(granularity, c.num_hidden_layers, c.num_key_value_heads);
  engine::EngineOptions o;
  o.mode = mode;
  o.pool = {.num_blocks = 160 * groups, .block_size = 7, .headroom_blocks = 8 * groups};
  o.reclaim.trigger = ReclaimOptions::Trigger::kAlways;
  o.reclaim.max_moves_per_step *= groups;
  o.policy = "h2o";
  o.evictor = {.keep_ratio = 0.3, .num_sink = 2, .num_recent = 8};
  o.evictor.granularity = granularity;
  o.evictor.num_layers = static_cast<int32_t>(c.num_hidden_layers);
  o.evictor.num_kv_heads = static_cast<int32_t>(c.num_key_value_heads);
  o.max_prefill_chunk = 96;
  o.verify = true;
  VTOKEN_ASSIGN_OR_RETURN(LlamaModel m, LlamaModel::RandomInit(c, 3, options));
  VTOKEN_ASSIGN_OR_RETURN(
      std::unique_ptr<LlamaRunner> runner,
      LlamaRunner::Create(
          std::move(m), {.num_slots = int64_t{o.pool.num_blocks} * 7, .granularity = granularity}));
  *copy_engine = runner->copy_engine_kind();
  std::vector<engine::Request> requests;
  for (int i = 0; i < 4; ++i) {
    engine::Request r;
    r.id = i;
    for (int t = 0; t < 120 + 17 * i; ++t) r.prompt_tokens.push_back(2 + (t * 31 + i * 7) % 95);
    r.max_tokens = 16;
    requests.push_back(std::move(r));
  }
  StatusOr<engine::EngineResult> result = engine::RunEngine(o, *runner, requests);
  *device_hashes = {runner->device_hash_calls(), runner->device_hash_failures()};
  return result;
}

// naive and vtoken: the same greedy tokens in `dtype` on `device`, with verified relocations.
void ExpectNaiveEqualsVtoken(const LlamaOptions& options, const std::string& expected_engine) {
  for (Granularity g : {Granularity::kToken, Granularity::kHead}) {
    SCOPED_TRACE(GranularityName(g));
    std::string engine_kind;
    std::array<int64_t, 2> device_hashes{};
    StatusOr<engine::EngineResult> naive =
        RunMode(Mode::kNaive, options, g, &engine_kind, &device_hashes);
    ASSERT_TRUE(naive.ok()) << naive.status().ToString();
    StatusOr<engine::EngineResult> vt =
        RunMode(Mode::kVtoken, options, g, &engine_kind, &device_hashes);
    ASSERT_TRUE(vt.ok()) << vt.status().ToString();
    EXPECT_EQ(engine_kind, expected_engine);
    EXPECT_GT(vt->moves, 0);
    EXPECT_EQ(vt->hash_checks, vt->moves);
    // With the CUDA copy engine the hashes are the device's (lib/cuda's kernel), none falling
    // back to the host; else the host's.
    EXPECT_EQ(device_hashes[1], 0) << "device hashing failed (the run's stderr says why)";
    if (expected_engine == "cuda") {
      EXPECT_GT(device_hashes[0], 0);
    } else {
      EXPECT_EQ(device_hashes[0], 0);
    }
    EXPECT_EQ(vt->violations, 0) << vt->first_violations[0];
    EXPECT_EQ(vt->evictions, naive->evictions);
    for (size_t i = 0; i < vt->requests.size(); ++i) {
      EXPECT_EQ(vt->requests[i].output_tokens, naive->requests[i].output_tokens) << "request " << i;
    }
  }
}

TEST(TorchDeviceTest, Bfloat16NaiveAndVtokenAgreeOnTheCpu) {
  ExpectNaiveEqualsVtoken(Options(torch::kCPU, torch::kBFloat16), "torch");
}

TEST(TorchDeviceTest, Bfloat16NaiveAndVtokenAgreeOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
#ifdef VTOKEN_MODEL_CUDA_KERNELS
  const std::string expected = "cuda";
#else
  const std::string expected = "torch";
#endif
  ExpectNaiveEqualsVtoken(Options(torch::Device(torch::kCUDA, 0), torch::kBFloat16), expected);
  ExpectNaiveEqualsVtoken(Options(torch::Device(torch::kCUDA, 0), torch::kFloat32), expected);
}

}  // namespace
}  // namespace vtoken::model
