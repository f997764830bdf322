// libFuzzer target: TOML experiment configs (`vtoken-cli run` / `sweep`). Loading must return
// an error or a config whose resolved TOML loads again to the same resolved TOML; no crash,
// overflow (UBSan) or unbounded allocation.
#include <cstddef>
#include <cstdint>
#include <string>

#include "apps/vtoken-cli/config/experiment_config.h"
#include "tests/fuzz/fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vtoken;
  const std::string path = fuzz::WriteInput(data, size, ".toml");
  StatusOr<cli::ExperimentConfig> c = cli::LoadExperimentConfig(path, {});
  if (!c.ok()) return 0;
  if (c->resolved_toml.size() != c->modes.size()) fuzz::Fail("one resolved config per mode");
  const std::string again_path =
      fuzz::WriteInput(reinterpret_cast<const uint8_t*>(c->resolved_toml[0].data()),
                       c->resolved_toml[0].size(), ".resolved.toml");
  StatusOr<cli::ExperimentConfig> again = cli::LoadExperimentConfig(again_path, {});
  if (!again.ok()) fuzz::Fail("resolved config rejected: " + again.status().message());
  if (again->resolved_toml[0] != c->resolved_toml[0]) fuzz::Fail("resolved config not stable");
  return 0;
}
