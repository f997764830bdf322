#include "lib/core/token_signal.h"

#include <cstdio>
#include <cstdlib>
#include <map>

namespace vtoken {
namespace {

std::map<std::string, TokenSignalInfo, std::less<>>& Registry() {
  static std::map<std::string, TokenSignalInfo, std::less<>> registry;
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
  auto& registry = Registry();
  auto it = registry.find(info.name);
  if (it != registry.end()) {
    std::fprintf(stderr, "vtoken: token signal '%s' is registered twice (%s and %s)\n",
                 info.name.c_str(), it->second.source_file.c_str(), info.source_file.c_str());
    std::exit(1);
  }
  std::string name = info.name;
  registry.emplace(std::move(name), std::move(info));
  return true;
}

std::vector<const TokenSignalInfo*> RegisteredTokenSignals() {
  std::vector<const TokenSignalInfo*> out;
  for (const auto& [name, info] : Registry()) out.push_back(&info);
  return out;
}

StatusOr<const TokenSignalInfo*> FindTokenSignal(std::string_view name) {
  const auto& registry = Registry();
  auto it = registry.find(name);
  if (it != registry.end()) return &it->second;
  std::string known;
  for (const auto& [n, info] : registry) known += (known.empty() ? "" : ", ") + n;
  return NotFoundError("unknown token signal '" + std::string(name) +
                       "' (registered: " + (known.empty() ? "none" : known) + ")");
}

std::vector<TokenSignalFn> TokenSignalFns(std::span<const TokenSignalInfo* const> infos) {
  std::vector<TokenSignalFn> fns;
  fns.reserve(infos.size());
  for (const TokenSignalInfo* info : infos) fns.push_back(info->fn);
  return fns;
}

void ReduceTokenSignals(std::span<const TokenSignalFn> fns, const float* keys, const float* values,
                        int64_t layers, int64_t heads, int64_t head_dim, float* out) {
  const float inv_heads = 1.0f / static_cast<float>(heads);
  const auto dim = static_cast<size_t>(head_dim);
  for (size_t j = 0; j < fns.size(); ++j) {
    float sum = 0;
    for (int64_t row = 0; row < layers * heads; ++row) {
      const size_t at = static_cast<size_t>(row) * dim;
      sum +=
          fns[j](std::span<const float>(keys + at, dim), std::span<const float>(values + at, dim)) *
          inv_heads;
    }
    out[j] = sum / static_cast<float>(layers);
  }
}

}  // namespace vtoken
