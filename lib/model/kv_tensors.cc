#include "lib/model/kv_tensors.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>

#include "lib/model/cpu_pool.h"
#include "lib/model/cpu_threads.h"

namespace vtoken::model {

int64_t KvBytesPerToken(const KvTensorsOptions& o) {
  return 2 * o.num_layers * o.num_kv_heads * o.head_dim *
         static_cast<int64_t>(c10::elementSize(o.dtype));
}

StatusOr<KvTensors> KvTensors::Create(const KvTensorsOptions& options) {
  if (options.num_layers <= 0 || options.num_slots <= 0 || options.num_kv_heads <= 0 ||
      options.head_dim <= 0) {
    return InvalidArgumentError(
        "KvTensors: num_layers, num_slots, num_kv_heads and head_dim "
        "must be positive");
  }
  if (options.scratch_slots < 0) {
    return InvalidArgumentError("KvTensors: scratch_slots must be >= 0, got " +
                                std::to_string(options.scratch_slots));
  }
  KvTensors kv;
  kv.options_ = options;
  auto tensor_options = torch::TensorOptions().dtype(options.dtype).device(options.device);
  const bool per_layer = options.granularity == Granularity::kToken;
  const int64_t heads = options.granularity == Granularity::kHead ? 1 : options.num_kv_heads;
  const int64_t slots = kv.allocated_slots();
  for (int64_t i = 0; i < (per_layer ? options.num_layers : 1); ++i) {
    kv.k_.push_back(torch::zeros({slots, heads, options.head_dim}, tensor_options));
    kv.v_.push_back(torch::zeros({slots, heads, options.head_dim}, tensor_options));
  }
  return kv;
}

int32_t KvTensors::num_kv_groups() const {
  return NumKvGroups(options_.granularity, options_.num_layers, options_.num_kv_heads);
}

int64_t KvTensors::rows_per_slot() const {
  return options_.num_layers * options_.num_kv_heads / num_kv_groups();
}

int64_t KvTensors::bytes_per_slot() const {
  return 2 * rows_per_slot() * options_.head_dim *
         static_cast<int64_t>(c10::elementSize(options_.dtype));
}

Status KvTensors::CheckSlots(std::span<const int64_t> slots) const {
  // A branch-free scan first (it vectorises: a step checks every key of every group); the
  // offender is looked for only when there is one. A negative slot is a huge unsigned one.
  const auto limit = static_cast<uint64_t>(options_.num_slots);
  bool out_of_range = false;
  for (int64_t slot : slots) out_of_range |= static_cast<uint64_t>(slot) >= limit;
  if (!out_of_range) return Status::Ok();
  for (int64_t slot : slots) {
    if (static_cast<uint64_t>(slot) >= limit) {
      return InvalidArgumentError("KvTensors: slot " + std::to_string(slot) + " out of range [0, " +
                                  std::to_string(options_.num_slots) + ")");
    }
  }
  return Status::Ok();
}

Status KvTensors::CopySlots(const std::vector<int64_t>& src_slots,
                            const std::vector<int64_t>& dst_slots) {
  if (src_slots.size() != dst_slots.size()) {
    return InvalidArgumentError("KvTensors::CopySlots: " + std::to_string(src_slots.size()) +
                                " sources but " + std::to_string(dst_slots.size()) +
                                " destinations");
  }
  VTOKEN_RETURN_IF_ERROR(CheckSlots(src_slots));
  VTOKEN_RETURN_IF_ERROR(CheckSlots(dst_slots));
  if (src_slots.empty()) return Status::Ok();
  torch::NoGradGuard no_grad;
  auto index_options = torch::TensorOptions().dtype(torch::kInt64).device(options_.device);
  auto src = torch::tensor(src_slots, index_options);
  auto dst = torch::tensor(dst_slots, index_options);
  for (size_t i = 0; i < k_.size(); ++i) {
    // index_select materializes the sources first: that is what makes overlapping moves safe.
    k_[i].index_copy_(0, dst, k_[i].index_select(0, src));
    v_[i].index_copy_(0, dst, v_[i].index_select(0, src));
  }
  return Status::Ok();
}

Status KvTensors::ReadSlots(std::span<const int64_t> slots, std::vector<std::byte>& out) const {
  VTOKEN_RETURN_IF_ERROR(CheckSlots(slots));
  if (slots.empty()) return Status::Ok();
  torch::NoGradGuard no_grad;
  auto index_options = torch::TensorOptions().dtype(torch::kInt64).device(options_.device);
  const auto index = torch::tensor(std::vector<int64_t>(slots.begin(), slots.end()), index_options);
  for (size_t i = 0; i < k_.size(); ++i) {
    for (const torch::Tensor* t : {&k_[i], &v_[i]}) {
      const torch::Tensor rows = t->index_select(0, index).to(torch::kCPU).contiguous();
      const size_t bytes = rows.numel() * rows.element_size();
      const size_t at = out.size();
      out.resize(at + bytes);
      std::memcpy(out.data() + at, rows.data_ptr(), bytes);
    }
  }
  return Status::Ok();
}

Status KvTensors::TokenSignals(std::span<const int64_t> slots,
                               std::span<const TokenSignalInfo* const> signals,
                               const TokenSignalScope& scope, const MomentsOf& moments,
                               std::vector<float>& out) const {
  VTOKEN_RETURN_IF_ERROR(CheckSlots(slots));
  const size_t n = slots.size(), nf = signals.size(), at = out.size();
  bool relative = false, need_k = false, need_v = false, sets = false;
  for (const TokenSignalInfo* s : signals) {
    relative = relative || s->relative();
    sets = sets || s->set != nullptr;
    need_k = need_k || s->reads_keys();
    need_v = need_v || s->reads_values();
  }
  if (sets && n > 0 && scope.positions.size() != n) {
    return InvalidArgumentError(
        "KvTensors::TokenSignals: " + std::to_string(scope.positions.size()) + " positions for " +
        std::to_string(n) + " slots");
  }
  // Which (layer, KV head) row head h of tensor t holds for the scope's group.
  const int64_t kv_heads = options_.num_kv_heads;
  auto row_of = [&](size_t t, size_t h) -> std::pair<int64_t, int64_t> {
    switch (options_.granularity) {
      case Granularity::kToken:
        return {static_cast<int64_t>(t), static_cast<int64_t>(h)};
      case Granularity::kLayer:
        return {scope.group, static_cast<int64_t>(h)};
      case Granularity::kHead:
        return {scope.group / kv_heads, scope.group % kv_heads};
    }
    return {0, 0};
  };
  for (const TokenSignalInfo* s : signals) {
    if (s->queries && n > 0 && !moments) {
      return FailedPreconditionError("token signal " + s->name +
                                     " reads query statistics, which the runner kept for no "
                                     "forward of request " +
                                     std::to_string(scope.request) +
                                     " (RunnerInput::keep_query_moments)");
    }
  }
  const int64_t heads = k_[0].size(1), dim = options_.head_dim;
  const auto nh = static_cast<size_t>(heads);
  const size_t nt = k_.size();
  // Signal j's columns start at first[j] of a slot's `width` values (views give several).
  std::vector<size_t> first(nf);
  size_t width = 0;
  for (size_t j = 0; j < nf; ++j) {
    first[j] = width;
    width += static_cast<size_t>(signals[j]->columns(static_cast<int64_t>(nt), heads));
  }
  out.resize(at + n * width, 0.0f);
  if (n == 0 || nf == 0) return Status::Ok();
  torch::NoGradGuard no_grad;
  const bool in_place = options_.device.is_cpu() && options_.dtype == torch::kFloat32;
  torch::Tensor index;
  if (!in_place) {
    index = torch::tensor(std::vector<int64_t>(slots.begin(), slots.end()),
                          torch::TensorOptions().dtype(torch::kInt64).device(options_.device));
  }
  const float inv_heads = 1.0f / static_cast<float>(heads);
  const auto row = static_cast<size_t>(dim);
  float* sums = out.data() + at;
  // Every row's value first, at vals[((t * nh + h) * n + i) * nf + j] (tensor t, head h, slot i,
  // signal j), then their sum in ReduceTokenSignals' order (tensor by tensor, then head by head),
  // so the bits are its whichever thread computed a value.
  std::vector<float> vals(nt * nh * n * nf);
  // A thread's buffers. With a relative signal, the rows of a tensor are first copied slot after
  // slot into a dense buffer (the store's slots are scattered; the passes below then read
  // sequential memory: 8.6 against 12.6 ms at 2048 live SmolLM2 tokens), then per head: pointers
  // to the live tokens' rows, each anchored signal's anchor and each set function's values.
  struct Scratch {
    std::vector<float> dense_k, dense_v, anchors, set_values;
    std::vector<const float*> key_rows, value_rows;
  };
  auto tensor_values = [&](size_t t, Scratch& sc) {
    torch::Tensor keys, values;
    if (in_place) {
      keys = k_[t], values = v_[t];
    } else {
      if (need_k) keys = k_[t].index_select(0, index).to(torch::kCPU, torch::kFloat32).contiguous();
      if (need_v) {
        values = v_[t].index_select(0, index).to(torch::kCPU, torch::kFloat32).contiguous();
      }
    }
    const float* kbase = need_k ? keys.data_ptr<float>() : nullptr;
    const float* vbase = need_v ? values.data_ptr<float>() : nullptr;
    const auto stride = static_cast<size_t>(need_k ? keys.stride(0) : values.stride(0));
    bool dense = !in_place;  // Rows i = 0..n-1 in order, `stride` apart.
    if (relative && in_place) {
      for (const auto& [base, copy, need] :
           {std::tuple{&kbase, &sc.dense_k, need_k}, std::tuple{&vbase, &sc.dense_v, need_v}}) {
        if (!need) continue;
        copy->resize(n * stride);
        for (size_t i = 0; i < n; ++i) {
          std::copy_n(*base + static_cast<size_t>(slots[i]) * stride, stride,
                      copy->data() + i * stride);
        }
        *base = copy->data();
      }
      dense = true;
    }
    auto offset = [&](size_t i, size_t h) {
      return (dense ? i : static_cast<size_t>(slots[i])) * stride + h * row;
    };
    if (relative) {
      sc.key_rows.resize(need_k ? n : 0);
      sc.value_rows.resize(need_v ? n : 0);
      sc.anchors.resize(nf * nh * row);
      sc.set_values.resize(sets ? nf * nh * n : 0);
    }
    for (size_t h = 0; relative && h < nh; ++h) {
      for (size_t i = 0; i < n; ++i) {
        if (need_k) sc.key_rows[i] = kbase + offset(i, h);
        if (need_v) sc.value_rows[i] = vbase + offset(i, h);
      }
      for (size_t j = 0; j < nf; ++j) {
        const TokenSignalInfo& signal = *signals[j];
        if (signal.anchor != nullptr) {
          signal.anchor(need_k ? sc.key_rows.data() : nullptr,
                        need_v ? sc.value_rows.data() : nullptr, static_cast<int64_t>(n), dim,
                        sc.anchors.data() + (j * nh + h) * row);
        } else if (signal.set != nullptr) {
          const auto [layer, kv_head] = row_of(t, h);
          const QueryMoments queries = signal.queries ? moments(layer, kv_head) : QueryMoments{};
          const TokenSignalRowSet set{
              .keys = signal.reads_keys() ? sc.key_rows.data() : nullptr,
              .values = signal.reads_values() ? sc.value_rows.data() : nullptr,
              .positions = scope.positions.data(),
              .n = static_cast<int64_t>(n),
              .head_dim = dim,
              .queries = signal.queries ? &queries : nullptr};
          signal.set(set, sc.set_values.data() + (j * nh + h) * n);
        }
      }
    }
    float* out_t = vals.data() + t * nh * n * nf;
    for (size_t h = 0; h < nh; ++h) {
      for (size_t i = 0; i < n; ++i) {
        for (size_t j = 0; j < nf; ++j) {
          const TokenSignalInfo& signal = *signals[j];
          float& v = out_t[(h * n + i) * nf + j];
          if (signal.set != nullptr) {
            v = sc.set_values[(j * nh + h) * n + i];
            continue;
          }
          const size_t off = offset(i, h);
          const std::span<const float> key = signal.reads_keys()
                                                 ? std::span<const float>(kbase + off, row)
                                                 : std::span<const float>();
          const std::span<const float> value = signal.reads_values()
                                                   ? std::span<const float>(vbase + off, row)
                                                   : std::span<const float>();
          const std::span<const float> anchor =
              signal.relative()
                  ? std::span<const float>(sc.anchors.data() + (j * nh + h) * row, row)
                  : std::span<const float>();
          v = signal.fn(key, value, anchor);
        }
      }
    }
  };
  // On the CPU in fp32 the tensors' values are computed on the CPU pool's threads when there is
  // work for several (a relative signal, or many slots): the rows are read in place, and the
  // signals are pure functions. Elsewhere each tensor is first gathered through torch, on this
  // thread.
  if (in_place && nt > 1 && (relative || n * nf >= 256)) {
    TorchThreadsPool()->ParallelFor(static_cast<int64_t>(nt), [&](int64_t begin, int64_t end) {
      Scratch sc;
      for (int64_t t = begin; t < end; ++t) tensor_values(static_cast<size_t>(t), sc);
    });
  } else {
    Scratch sc;
    for (size_t t = 0; t < nt; ++t) tensor_values(t, sc);
  }
  for (size_t t = 0; t < nt; ++t) {
    const float* out_t = vals.data() + t * nh * n * nf;
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < nf; ++j) {
        float* col = sums + i * width + first[j];
        switch (signals[j]->view) {
          case TokenSignalView::kMean:  // Summed over every row; divided below.
            for (size_t h = 0; h < nh; ++h) *col += out_t[(h * n + i) * nf + j] * inv_heads;
            break;
          case TokenSignalView::kLayer:
            for (size_t h = 0; h < nh; ++h) col[t] += out_t[(h * n + i) * nf + j] * inv_heads;
            break;
          case TokenSignalView::kHead:
            for (size_t h = 0; h < nh; ++h) col[t * nh + h] = out_t[(h * n + i) * nf + j];
            break;
        }
      }
    }
  }
  const float layers = static_cast<float>(nt);
  for (size_t j = 0; j < nf; ++j) {
    if (signals[j]->view != TokenSignalView::kMean) continue;
    for (size_t i = 0; i < n; ++i) sums[i * width + first[j]] /= layers;
  }
  return Status::Ok();
}

Status KvTensors::WriteSlots(std::span<const int64_t> slots, std::span<const std::byte> bytes) {
  VTOKEN_RETURN_IF_ERROR(CheckSlots(slots));
  const int64_t expected = static_cast<int64_t>(slots.size()) * bytes_per_slot();
  if (static_cast<int64_t>(bytes.size()) != expected) {
    return InvalidArgumentError("KvTensors::WriteSlots: " + std::to_string(bytes.size()) +
                                " bytes for " + std::to_string(slots.size()) + " slots of " +
                                std::to_string(bytes_per_slot()) + " bytes");
  }
  if (slots.empty()) return Status::Ok();
  torch::NoGradGuard no_grad;
  size_t at = 0;
  if (options_.device.is_cpu()) {  // Straight into the rows: one copy of the bytes.
    for (size_t i = 0; i < k_.size(); ++i) {
      for (torch::Tensor* t : {&k_[i], &v_[i]}) {
        const size_t row = static_cast<size_t>(t->stride(0) * t->element_size());
        auto* base = static_cast<std::byte*>(t->data_ptr());
        for (int64_t slot : slots) {
          std::memcpy(base + static_cast<size_t>(slot) * row, bytes.data() + at, row);
          at += row;
        }
      }
    }
    return Status::Ok();
  }
  auto index_options = torch::TensorOptions().dtype(torch::kInt64).device(options_.device);
  const auto index = torch::tensor(std::vector<int64_t>(slots.begin(), slots.end()), index_options);
  for (size_t i = 0; i < k_.size(); ++i) {
    for (torch::Tensor* t : {&k_[i], &v_[i]}) {
      std::vector<int64_t> shape = t->sizes().vec();
      shape[0] = static_cast<int64_t>(slots.size());
      torch::Tensor rows = torch::empty(shape, t->options().device(torch::kCPU));
      const size_t n = rows.numel() * rows.element_size();
      std::memcpy(rows.data_ptr(), bytes.data() + at, n);
      at += n;
      t->index_copy_(0, index, rows.to(t->device()));
    }
  }
  return Status::Ok();
}

}  // namespace vtoken::model
