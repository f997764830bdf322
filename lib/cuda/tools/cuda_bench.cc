// vtoken-cuda-bench: GPU micro-benchmarks for lib/cuda, one JSON object per line on stdout.
//   relocate  rows moved per launch vs one contiguous cudaMemcpyAsync of the same payload
//             (GB/s count reads + writes, payload_gb_per_s the rows moved)
//   engine    CudaCopyEngine Submit (host cost) and Submit+Wait round trip
//   hash      per-token XXH64 over all layers
//   attention paged decode attention over shuffled live-slot lists, with and without token mass
//   batch_attention  PagedBatchAttention (bf16) on the same decode shapes, with and without signals
// Timings are CUDA-event times (device) except the engine's, which are host wall-clock times.
// Usage: vtoken-cuda-bench [--quick]   (--quick: smaller shapes, fewer iterations)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "lib/cuda/cuda_copy_engine.h"
#include "lib/cuda/device.h"
#include "lib/cuda/kv_hash.h"
#include "lib/cuda/paged_attention.h"
#include "lib/cuda/paged_batch_attention.h"
#include "lib/cuda/relocate.h"

namespace vtoken::cuda {
namespace {

[[noreturn]] void Die(const Status& status, const char* what) {
  std::fprintf(stderr, "vtoken-cuda-bench: error: %s: %s\n", what, status.ToString().c_str());
  std::exit(1);
}

template <typename T>
T Check(StatusOr<T> value, const char* what) {
  if (!value.ok()) Die(value.status(), what);
  return std::move(value).value();
}

void Check(const Status& status, const char* what) {
  if (!status.ok()) Die(status, what);
}

void CheckCuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    Die(InternalError(std::string(cudaGetErrorName(error)) + ": " + cudaGetErrorString(error)),
        what);
  }
}

// Mean device milliseconds of `iters` runs of `body` on `stream`, after 3 warm-up runs.
template <typename Body>
double TimeMs(cudaStream_t stream, int iters, Body body) {
  for (int i = 0; i < 3; ++i) body();
  cudaEvent_t start, stop;
  CheckCuda(cudaEventCreate(&start), "cudaEventCreate");
  CheckCuda(cudaEventCreate(&stop), "cudaEventCreate");
  CheckCuda(cudaEventRecord(start, stream), "cudaEventRecord");
  for (int i = 0; i < iters; ++i) body();
  CheckCuda(cudaEventRecord(stop, stream), "cudaEventRecord");
  CheckCuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  CheckCuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  CheckCuda(cudaEventDestroy(start), "cudaEventDestroy");
  CheckCuda(cudaEventDestroy(stop), "cudaEventDestroy");
  return ms / iters;
}

struct Kv {
  std::vector<DeviceBuffer> k, v;
  std::vector<void*> k_ptrs, v_ptrs;
};

Kv AllocateKv(int32_t layers, int64_t slots, int64_t bytes_per_row) {
  Kv kv;
  for (int32_t l = 0; l < layers; ++l) {
    kv.k.push_back(Check(DeviceBuffer::Allocate(slots * bytes_per_row), "allocate K"));
    kv.v.push_back(Check(DeviceBuffer::Allocate(slots * bytes_per_row), "allocate V"));
    Check(kv.k.back().Fill(static_cast<uint8_t>(l)), "fill K");
    Check(kv.v.back().Fill(static_cast<uint8_t>(l + 1)), "fill V");
    kv.k_ptrs.push_back(kv.k.back().data());
    kv.v_ptrs.push_back(kv.v.back().data());
  }
  return kv;
}

// n copies from random slots of the first half to random slots of the second half.
std::vector<SlotCopy> RandomCopies(int64_t n, int64_t slots, std::mt19937_64& rng) {
  std::vector<int64_t> perm(slots / 2);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int64_t> dst = perm;
  std::shuffle(dst.begin(), dst.end(), rng);
  std::vector<SlotCopy> copies(n);
  for (int64_t i = 0; i < n; ++i) copies[i] = {perm[i], slots / 2 + dst[i]};
  return copies;
}

void BenchRelocateAndEngine(bool quick, std::mt19937_64& rng) {
  const int32_t layers = 32;
  const int64_t bytes_per_row = 8 * 128 * 2;  // 8 KV heads x 128 dims, fp16/bf16 (Llama-3-8B).
  const int64_t slots = quick ? 16384 : 65536;
  Kv kv = AllocateKv(layers, slots, bytes_per_row);
  std::unique_ptr<CudaCopyEngine> engine =
      Check(CudaCopyEngine::Create(kv.k_ptrs, kv.v_ptrs, slots, bytes_per_row), "engine");
  cudaStream_t stream = engine->copy_stream();
  // The memcpy baseline's own buffers, as large as the largest relocation's payload: one copy of
  // all the bytes, with no per-call launch cost for the relocation kernel to beat.
  const int64_t max_n = quick ? 8192 : 32768;
  const size_t max_payload = static_cast<size_t>(max_n) * layers * 2 * bytes_per_row;
  DeviceBuffer memcpy_src = Check(DeviceBuffer::Allocate(max_payload), "allocate memcpy source");
  DeviceBuffer memcpy_dst = Check(DeviceBuffer::Allocate(max_payload), "allocate memcpy target");
  for (int64_t n : {int64_t{16}, int64_t{256}, int64_t{4096}, max_n}) {
    std::vector<SlotCopy> copies = RandomCopies(n, slots, rng);
    DeviceBuffer list = Check(DeviceBuffer::Allocate(n * sizeof(SlotPair)), "allocate list");
    Check(list.CopyFromHost(copies.data(), n * sizeof(SlotPair)), "upload list");
    const double bytes = 2.0 * n * layers * 2 * bytes_per_row;  // Read + write.
    const double ms = TimeMs(stream, quick ? 5 : 20, [&] {
      Check(RelocateRows(engine->view(), list.as<SlotPair>(), n, stream), "relocate");
    });
    // The same payload as one contiguous device-to-device cudaMemcpyAsync: the bandwidth
    // ceiling. gb_per_s and memcpy_gb_per_s both count reads + writes (2 x the payload);
    // payload_gb_per_s is the rows moved per second (the simulator's copy_tbps, in GB/s).
    const size_t payload = static_cast<size_t>(n) * layers * 2 * bytes_per_row;
    const double memcpy_ms = TimeMs(stream, quick ? 5 : 20, [&] {
      CheckCuda(cudaMemcpyAsync(memcpy_dst.data(), memcpy_src.data(), payload,
                                cudaMemcpyDeviceToDevice, stream),
                "memcpy");
    });
    std::printf(
        "{\"bench\":\"relocate\",\"layers\":%d,\"bytes_per_row\":%ld,\"copies\":%ld,"
        "\"ms\":%.4f,\"gb_per_s\":%.1f,\"payload_gb_per_s\":%.1f,\"memcpy_ms\":%.4f,"
        "\"memcpy_gb_per_s\":%.1f}\n",
        layers, bytes_per_row, n, ms, bytes / ms / 1e6, bytes / 2 / ms / 1e6, memcpy_ms,
        bytes / memcpy_ms / 1e6);

    const int iters = quick ? 10 : 50;
    double submit_us = 0, round_trip_us = 0;
    for (int i = 0; i < iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      const CopyTicket ticket = Check(engine->TrySubmit(copies), "submit");
      const auto t1 = std::chrono::steady_clock::now();
      Check(engine->TryWait(ticket), "wait");
      const auto t2 = std::chrono::steady_clock::now();
      submit_us += std::chrono::duration<double, std::micro>(t1 - t0).count();
      round_trip_us += std::chrono::duration<double, std::micro>(t2 - t0).count();
    }
    std::printf("{\"bench\":\"engine\",\"copies\":%ld,\"submit_us\":%.1f,\"round_trip_us\":%.1f}\n",
                n, submit_us / iters, round_trip_us / iters);
  }

  const int64_t tokens = quick ? 1024 : 8192;
  std::vector<int64_t> hash_slots(tokens);
  std::iota(hash_slots.begin(), hash_slots.end(), 0);
  DeviceBuffer slots_d = Check(DeviceBuffer::Allocate(tokens * sizeof(int64_t)), "allocate slots");
  DeviceBuffer hashes_d =
      Check(DeviceBuffer::Allocate(tokens * sizeof(uint64_t)), "allocate hashes");
  Check(slots_d.CopyFromHost(hash_slots.data(), tokens * sizeof(int64_t)), "upload slots");
  const double hash_ms = TimeMs(stream, quick ? 3 : 10, [&] {
    Check(HashTokenRows(engine->view(), slots_d.as<int64_t>(), tokens, hashes_d.as<uint64_t>(),
                        stream),
          "hash");
  });
  const double hashed = static_cast<double>(tokens) * layers * 2 * bytes_per_row;
  std::printf("{\"bench\":\"hash\",\"tokens\":%ld,\"layers\":%d,\"ms\":%.4f,\"gb_per_s\":%.1f}\n",
              tokens, layers, hash_ms, hashed / hash_ms / 1e6);
}

// The context lengths of both attention benchmarks.
std::vector<int64_t> AttentionContexts(bool quick) {
  return quick ? std::vector<int64_t>{1024, 4096} : std::vector<int64_t>{1024, 4096, 16384};
}

void BenchAttention(bool quick, std::mt19937_64& rng) {
  const int32_t num_seqs = 32, num_heads = 32, num_kv_heads = 8, head_dim = 128;
  for (int64_t context : AttentionContexts(quick)) {
    const int64_t tokens = num_seqs * context;
    const int64_t slots = tokens;
    const size_t row_floats = static_cast<size_t>(num_kv_heads) * head_dim;
    DeviceBuffer k = Check(DeviceBuffer::Allocate(slots * row_floats * 4), "allocate K");
    DeviceBuffer v = Check(DeviceBuffer::Allocate(slots * row_floats * 4), "allocate V");
    DeviceBuffer q =
        Check(DeviceBuffer::Allocate(size_t{4} * num_seqs * num_heads * head_dim), "q");
    DeviceBuffer out =
        Check(DeviceBuffer::Allocate(size_t{4} * num_seqs * num_heads * head_dim), "out");
    DeviceBuffer lse = Check(DeviceBuffer::Allocate(size_t{4} * num_seqs * num_heads), "lse");
    DeviceBuffer mass = Check(DeviceBuffer::Allocate(4 * tokens), "mass");
    // Zero bytes are 0.0f: scores are all equal, which does not change the work done.
    Check(k.Fill(0), "fill");
    Check(v.Fill(0), "fill");
    Check(q.Fill(0), "fill");
    // Shuffled slots: each sequence's live tokens are scattered, as after many relocations.
    std::vector<int64_t> slot_list(tokens);
    std::iota(slot_list.begin(), slot_list.end(), 0);
    std::shuffle(slot_list.begin(), slot_list.end(), rng);
    std::vector<int64_t> offsets(num_seqs + 1);
    for (int32_t s = 0; s <= num_seqs; ++s) offsets[s] = s * context;
    DeviceBuffer slots_d = Check(DeviceBuffer::Allocate(tokens * 8), "slots");
    DeviceBuffer offsets_d = Check(DeviceBuffer::Allocate(offsets.size() * 8), "offsets");
    Check(slots_d.CopyFromHost(slot_list.data(), tokens * 8), "upload");
    Check(offsets_d.CopyFromHost(offsets.data(), offsets.size() * 8), "upload");
    PagedDecodeArgs args;
    args.q = q.as<float>();
    args.k = k.as<float>();
    args.v = v.as<float>();
    args.seq_offsets = offsets_d.as<int64_t>();
    args.slots = slots_d.as<int64_t>();
    args.out = out.as<float>();
    args.num_seqs = num_seqs;
    args.num_heads = num_heads;
    args.num_kv_heads = num_kv_heads;
    args.head_dim = head_dim;
    args.num_slots = slots;
    args.num_tokens = tokens;
    args.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    const int iters = quick ? 3 : 10;
    const double ms =
        TimeMs(nullptr, iters, [&] { Check(PagedDecodeAttention(args, nullptr), "attention"); });
    args.lse = lse.as<float>();
    args.token_mass = mass.as<float>();
    const double mass_ms = TimeMs(
        nullptr, iters, [&] { Check(PagedDecodeAttention(args, nullptr), "attention+mass"); });
    const double kv_bytes = 2.0 * tokens * row_floats * 4;
    std::printf(
        "{\"bench\":\"attention\",\"num_seqs\":%d,\"context\":%ld,\"num_heads\":%d,"
        "\"num_kv_heads\":%d,\"head_dim\":%d,\"ms\":%.4f,\"kv_gb_per_s\":%.1f,"
        "\"with_mass_ms\":%.4f}\n",
        num_seqs, context, num_heads, num_kv_heads, head_dim, ms, kv_bytes / ms / 1e6, mass_ms);
  }
}

// Decode steps (one query row per sequence) of the batched kernel in bf16 over shuffled slots.
void BenchBatchAttention(bool quick, std::mt19937_64& rng) {
  const int32_t num_seqs = 32, num_heads = 32, num_kv_heads = 8, head_dim = 128;
  for (int64_t context : AttentionContexts(quick)) {
    const int64_t keys = num_seqs * context;
    const size_t row_bytes = size_t{2} * num_kv_heads * head_dim;
    DeviceBuffer k = Check(DeviceBuffer::Allocate(keys * row_bytes), "allocate K");
    DeviceBuffer v = Check(DeviceBuffer::Allocate(keys * row_bytes), "allocate V");
    DeviceBuffer q =
        Check(DeviceBuffer::Allocate(size_t{2} * num_seqs * num_heads * head_dim), "q");
    DeviceBuffer out =
        Check(DeviceBuffer::Allocate(size_t{2} * num_seqs * num_heads * head_dim), "out");
    Check(k.Fill(0), "fill");
    Check(v.Fill(0), "fill");
    Check(q.Fill(0), "fill");
    // Host arrays: slots shuffled over the cache, positions 0.. per sequence, the new token last.
    std::vector<int64_t> slot_list(keys), positions(keys), q_offsets(num_seqs + 1),
        key_offsets(num_seqs + 1), num_signal(num_seqs, 1);
    std::iota(slot_list.begin(), slot_list.end(), 0);
    std::shuffle(slot_list.begin(), slot_list.end(), rng);
    for (int32_t s = 0; s <= num_seqs; ++s) {
      q_offsets[s] = s;
      key_offsets[s] = s * context;
    }
    for (int64_t j = 0; j < keys; ++j) positions[j] = j % context;
    std::vector<uint8_t> want(num_seqs, 1);
    auto upload = [](const auto& host) {
      DeviceBuffer buffer = Check(DeviceBuffer::Allocate(host.size() * sizeof(host[0])), "csr");
      Check(buffer.CopyFromHost(host.data(), host.size() * sizeof(host[0])), "upload");
      return buffer;
    };
    DeviceBuffer slots_d = upload(slot_list), positions_d = upload(positions);
    DeviceBuffer q_offsets_d = upload(q_offsets), key_offsets_d = upload(key_offsets);
    DeviceBuffer num_signal_d = upload(num_signal), want_d = upload(want);
    DeviceBuffer attn = Check(DeviceBuffer::Allocate(4 * keys), "attn");
    DeviceBuffer norm = Check(DeviceBuffer::Allocate(4 * keys), "norm");
    PagedBatchArgs args;
    args.dtype = AttnDtype::kBFloat16;
    args.q = q.data();
    args.k_cache = k.data();
    args.v_cache = v.data();
    args.out = out.data();
    args.q_offsets = q_offsets_d.as<int64_t>();
    args.key_offsets = key_offsets_d.as<int64_t>();
    args.slots = slots_d.as<int64_t>();
    args.key_positions = positions_d.as<int64_t>();
    args.num_signal = num_signal_d.as<int64_t>();
    args.num_seqs = num_seqs;
    args.num_heads = num_heads;
    args.num_kv_heads = num_kv_heads;
    args.head_dim = head_dim;
    args.num_rows = num_seqs;
    args.num_keys = keys;
    args.num_slots = keys;
    args.slot_stride = static_cast<int64_t>(num_kv_heads) * head_dim;
    args.kv_head_stride = head_dim;
    args.norm_heads = num_kv_heads;
    args.max_query_rows = 1;
    args.max_keys = context;
    args.max_signal_rows = 1;
    args.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    auto time_ms = [&](const PagedBatchArgs& a, const char* what) {
      const size_t bytes = PagedBatchWorkspaceBytes(a);
      DeviceBuffer workspace = Check(DeviceBuffer::Allocate(bytes), "workspace");
      return TimeMs(nullptr, quick ? 3 : 10,
                    [&] { Check(PagedBatchAttention(a, workspace.data(), bytes, nullptr), what); });
    };
    const double ms = time_ms(args, "batch attention");
    PagedBatchArgs with_signals = args;
    with_signals.want_signals = want_d.as<uint8_t>();
    with_signals.attn_sum = attn.as<float>();
    with_signals.norm_sum = norm.as<float>();
    const double signals_ms = time_ms(with_signals, "batch attention+signals");
    const double kv_bytes = 2.0 * static_cast<double>(keys) * static_cast<double>(row_bytes);
    std::printf(
        "{\"bench\":\"batch_attention\",\"dtype\":\"bf16\",\"num_seqs\":%d,\"context\":%ld,"
        "\"num_heads\":%d,\"num_kv_heads\":%d,\"head_dim\":%d,\"partitions\":%d,\"ms\":%.4f,"
        "\"kv_gb_per_s\":%.1f,\"with_signals_ms\":%.4f}\n",
        num_seqs, context, num_heads, num_kv_heads, head_dim, PagedBatchPartitions(args), ms,
        kv_bytes / ms / 1e6, signals_ms);
  }
}

}  // namespace
}  // namespace vtoken::cuda

int main(int argc, char** argv) {
  using namespace vtoken::cuda;
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  // One JSON line per measurement, each on its way at once: a run cut short by a timeout keeps
  // the lines it finished (stdout is a pipe to tee in the device run, block-buffered otherwise).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (vtoken::Status status = CudaDeviceStatus(); !status.ok()) {
    std::fprintf(stderr, "vtoken-cuda-bench: error: %s\n", status.ToString().c_str());
    return 2;
  }
  const std::string device = Check(CudaDeviceDescription(), "device");
  std::printf("{\"bench\":\"device\",\"name\":\"%s\"}\n", device.c_str());
  std::mt19937_64 rng(1);
  BenchRelocateAndEngine(quick, rng);
  BenchAttention(quick, rng);
  BenchBatchAttention(quick, rng);
  return 0;
}
