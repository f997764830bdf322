#include "lib/core/token_signal.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "lib/core/named_registry.h"

namespace vtoken {
namespace {

NamedRegistry<TokenSignalInfo>& Registry() {
  static NamedRegistry<TokenSignalInfo> registry("token signal");
  return registry;
}

constexpr std::pair<std::string_view, TokenSignalView> kViews[] = {
    {"layer", TokenSignalView::kLayer}, {"head", TokenSignalView::kHead}};

// The entry of view `view` of `base`, made on first use and kept (pointers stay valid).
const TokenSignalInfo* ViewOf(const TokenSignalInfo& base, std::string_view suffix,
                              TokenSignalView view) {
  static std::mutex mu;
  static std::map<std::string, TokenSignalInfo, std::less<>> views;
  const std::string name = base.name + "@" + std::string(suffix);
  std::lock_guard<std::mutex> lock(mu);
  auto it = views.find(name);
  if (it == views.end()) {
    TokenSignalInfo info = base;
    info.name = name;
    info.view = view;
    it = views.emplace(name, std::move(info)).first;
  }
  return &it->second;
}

bool SnakeCase(std::string_view s) {
  if (s.empty() || s[0] < 'a' || s[0] > 'z') return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
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
  if (!SnakeCase(info.name)) {
    std::fprintf(stderr, "vtoken: token signal '%s' (%s) is not a snake_case name\n",
                 info.name.c_str(), info.source_file.c_str());
    std::exit(1);
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
  const size_t at = name.find('@');
  if (at == std::string_view::npos) return Registry().Find(name);
  VTOKEN_ASSIGN_OR_RETURN(const TokenSignalInfo* base, Registry().Find(name.substr(0, at)));
  const std::string_view suffix = name.substr(at + 1);
  for (const auto& [view_name, view] : kViews) {
    if (suffix == view_name) return ViewOf(*base, suffix, view);
  }
  return NotFoundError("unknown token signal view '" + std::string(name) +
                       "' (views: " + base->name + "@layer, " + base->name + "@head)");
}

KvGroupRows KvGroupRowsOf(Granularity granularity, int64_t num_layers, int64_t num_kv_heads) {
  switch (granularity) {
    case Granularity::kToken:
      return {num_layers, num_kv_heads};
    case Granularity::kLayer:
      return {1, num_kv_heads};
    case Granularity::kHead:
      return {1, 1};
  }
  return {};
}

int64_t TokenSignalWidth(std::span<const TokenSignalInfo* const> infos, KvGroupRows rows) {
  int64_t width = 0;
  for (const TokenSignalInfo* info : infos) width += info->columns(rows.layers, rows.heads);
  return width;
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
  const auto nh = static_cast<size_t>(heads);
  for (size_t j = 0; j < infos.size(); ++j) {
    const TokenSignalView view = infos[j]->view;
    float sum = 0;  // kMean: over every row; kLayer: over the layer's rows.
    for (size_t row = 0; row < rows; ++row) {
      const size_t at = row * dim;
      const std::span<const float> anchor =
          infos[j]->relative() ? std::span<const float>(anchors + (j * rows + row) * dim, dim)
                               : std::span<const float>();
      const float v = infos[j]->fn(std::span<const float>(keys + at, dim),
                                   std::span<const float>(values + at, dim), anchor);
      if (view == TokenSignalView::kHead) {
        out[row] = v;
        continue;
      }
      sum += v * inv_heads;
      if (view == TokenSignalView::kLayer && row % nh == nh - 1) {
        out[row / nh] = sum;
        sum = 0;
      }
    }
    if (view == TokenSignalView::kMean) out[0] = sum / static_cast<float>(layers);
    out += infos[j]->columns(layers, heads);
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
