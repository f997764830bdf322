#include "lib/core/types.h"

namespace vtoken {

const char* ModeName(Mode mode) {
  switch (mode) {
    case Mode::kNative: return "native";
    case Mode::kNaive: return "naive";
    case Mode::kVtoken: return "vtoken";
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

}  // namespace vtoken
