// Where a model lives and what it is made of: the one place that knows the two on-disk forms.
//
// A model is named by
//   - a Hugging Face directory (config.json, model.safetensors or shards, tokenizer.json),
//   - a GGUF file (llama.cpp's single-file format: weights, config and tokenizer together), or
//   - a short name from models/registry/ (e.g. "smollm2-135m") that scripts/fetch-model.sh has
//     fetched into the cache: .cache/models/NAME/ holding one .gguf file.
// Short names are looked up in $VTOKEN_MODELS_DIR when set; else in $VTOKEN_CACHE_DIR/models
// (where scripts/fetch-model.sh puts them when that is set), ./.cache/models and the source tree's
// .cache/models (the build records where the source tree is), in that order.
//
// All functions touch only the files they name; safe to call concurrently.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lib/core/status.h"
#include "lib/model/io/chat_template.h"
#include "lib/model/io/hf_config.h"
#include "lib/model/io/tokenizer.h"

namespace vtoken::model {

// Returns the path `spec` names: `spec` itself when it is an existing file or directory, else the
// cached file of the short name `spec`. NotFound, one line, naming `spec`: for a name of
// models/registry/ not fetched yet, the command that fetches it; else the known names.
StatusOr<std::string> ResolveModelPath(const std::string& spec);

// True when `path` is a regular file (a GGUF file; directories are Hugging Face checkpoints).
bool IsModelFile(const std::string& path);

// The ModelConfig of the model `spec` names (resolved): config.json of a directory, or the
// metadata and tensor set of a GGUF file (GgufCheckpoint::Open, which validates the whole file).
// Errors name the file.
StatusOr<ModelConfig> ReadModelConfig(const std::string& spec);

// The tokenizer of the model `spec` names: the directory's tokenizer.json or the GGUF file's
// tokenizer.ggml.* metadata (TokenizerFromGguf). Errors name the file.
StatusOr<Tokenizer> LoadModelTokenizer(const std::string& spec);

// The chat template of the model `spec` names: the GGUF file's tokenizer.chat_template
// (ChatTemplateFromGguf) or the directory's (LoadHfChatTemplate). NotFound naming the file when
// it has none; ParseChatTemplate's error (quoting the template's first line) for one we cannot
// render.
StatusOr<ChatTemplate> LoadModelChatTemplate(const std::string& spec);

// A user turn rendered by `chat_template`, split around its content: the prompt is
// before + content + after. When the template renders a BOS and the engine prepends one itself
// (`engine_adds_bos`: the model's prompt BOS), the rendered one is left out so the prompt has
// exactly one.
struct ChatWrap {
  std::string before;
  std::string after;
};
ChatWrap ChatWrapFor(const ChatTemplate& chat_template, bool engine_adds_bos);

// What a run header says about a model: the file read, its format and, for GGUF, the tensor
// types ("Q4_1 x210, F32 x61, Q8_0 x1").
struct ModelDescription {
  std::string path;          // resolved: the directory or the .gguf file
  std::string format;        // "safetensors" or "gguf"
  std::string quantization;  // GGUF: GgufTypeMix(); safetensors: dtypes
};
StatusOr<ModelDescription> DescribeModel(const std::string& spec);

// The folders ResolveModelPath searches for short names, in order.
std::vector<std::string> ModelCacheDirs();

}  // namespace vtoken::model
