#include "lib/core/types.h"

namespace vtoken {

const char* ModeName(Mode mode) {
  switch (mode) {
    case Mode::kNative:
      return "native";
    case Mode::kNaive:
      return "naive";
    case Mode::kVtoken:
      return "vtoken";
  }
  return "unknown";
}

StatusOr<Mode> ParseMode(std::string_view name) {
  if (name == "native") return Mode::kNative;
  if (name == "naive") return Mode::kNaive;
  if (name == "vtoken") return Mode::kVtoken;
  return InvalidArgumentError("unknown mode '" + std::string(name) +
                              "' (expected native, naive or vtoken)");
}

const char* GranularityName(Granularity granularity) {
  switch (granularity) {
    case Granularity::kToken:
      return "token";
    case Granularity::kLayer:
      return "layer";
    case Granularity::kHead:
      return "head";
  }
  return "unknown";
}

StatusOr<Granularity> ParseGranularity(std::string_view name) {
  if (name == "token") return Granularity::kToken;
  if (name == "layer") return Granularity::kLayer;
  if (name == "head") return Granularity::kHead;
  return InvalidArgumentError("unknown granularity '" + std::string(name) +
                              "' (expected token, layer or head)");
}

int32_t NumKvGroups(Granularity granularity, int64_t num_layers, int64_t num_kv_heads) {
  switch (granularity) {
    case Granularity::kToken:
      return 1;
    case Granularity::kLayer:
      return static_cast<int32_t>(num_layers);
    case Granularity::kHead:
      return static_cast<int32_t>(num_layers * num_kv_heads);
  }
  return 1;
}

int32_t KvGroupOf(Granularity granularity, int64_t layer, int64_t kv_head, int64_t num_kv_heads) {
  switch (granularity) {
    case Granularity::kToken:
      return 0;
    case Granularity::kLayer:
      return static_cast<int32_t>(layer);
    case Granularity::kHead:
      return static_cast<int32_t>(layer * num_kv_heads + kv_head);
  }
  return 0;
}

}  // namespace vtoken
