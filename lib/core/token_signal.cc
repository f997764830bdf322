#include "lib/core/token_signal.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "lib/core/named_registry.h"

namespace vtoken {
namespace {

NamedRegistry<TokenSignalInfo>& Registry() {
  static NamedRegistry<TokenSignalInfo> registry("token signal");
  return registry;
}

}  // namespace

bool RegisterTokenSignal(TokenSignalInfo info) {
  for (const char* reserved : {"attn", "attn_sum", "key_norm", "position", "age", "state"}) {
    if (info.name == reserved) {
      std::fprintf(stderr, "vtoken: token signal '%s' (%s) takes the name of a policy signal\n",
                   info.name.c_str(), info.source_file.c_str());
      std::exit(1);
    }
  }
  const bool set = info.set != nullptr;
  if ((info.fn != nullptr) == set || (set && info.anchor != nullptr) || (info.queries && !set)) {
    std::fprintf(stderr,
                 "vtoken: token signal '%s' (%s) needs either a function of one row (and an "
                 "anchor) or a set function, and only a set function reads queries\n",
                 info.name.c_str(), info.source_file.c_str());
    std::exit(1);
  }
  Registry().Add(std::move(info));
  return true;
}

std::vector<const TokenSignalInfo*> RegisteredTokenSignals() { return Registry().All(); }

StatusOr<const TokenSignalInfo*> FindTokenSignal(std::string_view name) {
  return Registry().Find(name);
}

std::vector<const TokenSignalInfo*> TokenSignalsOfKind(
    std::span<const TokenSignalInfo* const> infos, bool relative) {
  std::vector<const TokenSignalInfo*> out;
  for (const TokenSignalInfo* info : infos) {
    if (info->relative() == relative) out.push_back(info);
  }
  return out;
}

void ReduceTokenSignals(std::span<const TokenSignalInfo* const> infos, const float* keys,
                        const float* values, int64_t layers, int64_t heads, int64_t head_dim,
                        float* out, const float* anchors) {
  const float inv_heads = 1.0f / static_cast<float>(heads);
  const auto dim = static_cast<size_t>(head_dim);
  const auto rows = static_cast<size_t>(layers * heads);
  for (size_t j = 0; j < infos.size(); ++j) {
    float sum = 0;
    for (size_t row = 0; row < rows; ++row) {
      const size_t at = row * dim;
      const std::span<const float> anchor =
          infos[j]->relative() ? std::span<const float>(anchors + (j * rows + row) * dim, dim)
                               : std::span<const float>();
      sum += infos[j]->fn(std::span<const float>(keys + at, dim),
                          std::span<const float>(values + at, dim), anchor) *
             inv_heads;
    }
    out[j] = sum / static_cast<float>(layers);
  }
}

std::vector<float> TokenSignalAnchors(std::span<const TokenSignalInfo* const> infos,
                                      const float* keys, const float* values, int64_t n,
                                      int64_t rows, int64_t head_dim) {
  const auto dim = static_cast<size_t>(head_dim), nr = static_cast<size_t>(rows);
  std::vector<float> anchors(infos.size() * nr * dim, 0.0f);
  std::vector<const float*> k(static_cast<size_t>(n)), v(static_cast<size_t>(n));
  for (size_t j = 0; j < infos.size(); ++j) {
    if (infos[j]->anchor == nullptr) continue;
    for (size_t r = 0; r < nr; ++r) {
      for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
        k[i] = keys + (i * nr + r) * dim;
        v[i] = values + (i * nr + r) * dim;
      }
      infos[j]->anchor(k.data(), v.data(), n, head_dim, anchors.data() + (j * nr + r) * dim);
    }
  }
  return anchors;
}

}  // namespace vtoken
