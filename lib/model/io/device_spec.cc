#include "lib/model/io/device_spec.h"

namespace vtoken::model {

StatusOr<DeviceSpec> ParseDeviceSpec(std::string_view name) {
  if (name == "cpu") return DeviceSpec{};
  if (name == "cuda") return DeviceSpec{.cuda = true};
  constexpr std::string_view kPrefix = "cuda:";
  const std::string_view digits =
      name.substr(0, kPrefix.size()) == kPrefix ? name.substr(kPrefix.size()) : "";
  if (!digits.empty() && digits.size() <= 3 &&
      digits.find_first_not_of("0123456789") == std::string_view::npos) {
    return DeviceSpec{.cuda = true, .index = std::stoi(std::string(digits))};
  }
  return InvalidArgumentError("device \"" + std::string(name) +
                              "\": must be \"cpu\", \"cuda\" or \"cuda:N\"");
}

StatusOr<ComputeDtype> ParseComputeDtype(std::string_view name) {
  for (ComputeDtype d : {ComputeDtype::kFloat32, ComputeDtype::kBFloat16, ComputeDtype::kFloat16}) {
    if (name == ComputeDtypeName(d)) return d;
  }
  return InvalidArgumentError("dtype \"" + std::string(name) +
                              "\": must be \"float32\", \"bfloat16\" or \"float16\"");
}

const char* ComputeDtypeName(ComputeDtype dtype) {
  switch (dtype) {
    case ComputeDtype::kFloat32:
      return "float32";
    case ComputeDtype::kBFloat16:
      return "bfloat16";
    case ComputeDtype::kFloat16:
      return "float16";
  }
  return "float32";
}

int ComputeDtypeBytes(ComputeDtype dtype) { return dtype == ComputeDtype::kFloat32 ? 4 : 2; }

}  // namespace vtoken::model
