// Where the SmolLM2 tests find the real model: VTOKEN_SMOLLM2_GGUF when set (any file), else the
// short name smollm2-135m resolved as vtoken-cli resolves it (the source tree's .cache/models,
// filled by scripts/fetch-model.sh, which ctest's fixture `smollm2` runs first).
#pragma once

#include <cstdlib>
#include <string>

#include "lib/core/status.h"
#include "lib/model/io/model_files.h"

namespace vtoken::model::testing {

// The model file's path, or an error saying how to get it.
inline StatusOr<std::string> SmolLm2Path() {
  if (const char* env = std::getenv("VTOKEN_SMOLLM2_GGUF"); env != nullptr && *env != '\0') {
    return std::string(env);
  }
  return ResolveModelPath("smollm2-135m");
}

}  // namespace vtoken::model::testing
