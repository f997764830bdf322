// libFuzzer target: config.json parsing. An accepted config must validate, count its
// parameters without overflow (UBSan) and survive ConfigToJson -> ParseConfigJsonText unchanged.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "lib/model/io/hf_config.h"
#include "tests/fuzz/fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vtoken;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  StatusOr<model::ModelConfig> c = model::ParseConfigJsonText(text, "fuzz");
  if (!c.ok()) return 0;
  if (!model::ValidateConfig(*c).ok()) fuzz::Fail("parsed config does not validate");
  if (model::ParameterCount(*c) < 0) fuzz::Fail("negative parameter count");
  StatusOr<model::ModelConfig> again = model::ParseConfigJsonText(model::ConfigToJson(*c), "again");
  if (!again.ok()) fuzz::Fail("ConfigToJson output rejected: " + again.status().message());
  if (!(*again == *c)) fuzz::Fail("ConfigToJson round trip changed the config");
  return 0;
}
