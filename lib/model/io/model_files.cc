#include "lib/model/io/model_files.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string_view>

#include "lib/model/io/checkpoint.h"
#include "lib/model/io/gguf_model.h"
#include "lib/model/io/gguf_tokenizer.h"

namespace vtoken::model {
namespace fs = std::filesystem;

std::vector<std::string> ModelCacheDirs() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("VTOKEN_MODELS_DIR"); env != nullptr && *env != '\0') {
    dirs.emplace_back(env);
    return dirs;
  }
  // scripts/fetch-model.sh writes into $VTOKEN_CACHE_DIR/models when that is set.
  if (const char* cache = std::getenv("VTOKEN_CACHE_DIR"); cache != nullptr && *cache != '\0') {
    dirs.push_back(std::string(cache) + "/models");
  }
  dirs.emplace_back(".cache/models");
#ifdef VTOKEN_SOURCE_DIR
  dirs.push_back(std::string(VTOKEN_SOURCE_DIR) + "/.cache/models");
#endif
  return dirs;
}

bool IsModelFile(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

StatusOr<std::string> ResolveModelPath(const std::string& spec) {
  std::error_code ec;
  if (fs::exists(spec, ec)) return spec;
  const bool short_name =
      !spec.empty() && spec.find('/') == std::string::npos && spec != "." && spec != "..";
  if (!short_name) return NotFoundError("model " + spec + " not found");
  std::string searched;
  for (const std::string& dir : ModelCacheDirs()) {
    const fs::path folder = fs::path(dir) / spec;
    searched += (searched.empty() ? "" : ", ") + folder.string();
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(folder, ec)) {
      if (entry.is_regular_file() && entry.path().extension() == ".gguf") {
        files.push_back(entry.path());
      }
    }
    if (files.size() == 1) return files[0].string();
    if (files.size() > 1) {
      return NotFoundError("model " + spec + ": " + folder.string() +
                           " holds more than one .gguf file");
    }
  }
  // The registry of names scripts/fetch-model.sh knows, beside the source tree's cache.
  std::string known;
#ifdef VTOKEN_SOURCE_DIR
  const fs::path registry = fs::path(VTOKEN_SOURCE_DIR) / "models" / "registry";
  if (fs::exists(registry / (spec + ".source"), ec)) {
    return NotFoundError("model " + spec + " is not fetched yet (looked in " + searched +
                         "): run scripts/fetch-model.sh " + spec);
  }
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(registry, ec)) {
    if (entry.path().extension() == ".source") names.push_back(entry.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
#endif
  return NotFoundError("model " + spec +
                       " not found: not a file, a directory or a known model name (known: " +
                       (known.empty() ? "none" : known) + ")");
}

StatusOr<ModelConfig> ReadModelConfig(const std::string& spec) {
  VTOKEN_ASSIGN_OR_RETURN(const std::string path, ResolveModelPath(spec));
  if (!IsModelFile(path)) return ParseConfigJson((fs::path(path) / "config.json").string());
  VTOKEN_ASSIGN_OR_RETURN(GgufCheckpoint checkpoint, GgufCheckpoint::Open(path));
  return checkpoint.config();
}

StatusOr<Tokenizer> LoadModelTokenizer(const std::string& spec) {
  VTOKEN_ASSIGN_OR_RETURN(const std::string path, ResolveModelPath(spec));
  if (!IsModelFile(path)) return Tokenizer::Load((fs::path(path) / "tokenizer.json").string());
  VTOKEN_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Open(path));
  return TokenizerFromGguf(file.metadata(), path);
}

StatusOr<ChatTemplate> LoadModelChatTemplate(const std::string& spec) {
  VTOKEN_ASSIGN_OR_RETURN(const std::string path, ResolveModelPath(spec));
  if (!IsModelFile(path)) return LoadHfChatTemplate(path);
  VTOKEN_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Open(path));
  return ChatTemplateFromGguf(file.metadata(), path);
}

ChatWrap ChatWrapFor(const ChatTemplate& chat_template, bool engine_adds_bos) {
  // A marker the renderers copy verbatim: no whitespace for Llama 3's trim to touch.
  constexpr std::string_view kMarker = "{{vtoken:content}}";
  const std::string text = RenderUserTurn(chat_template, kMarker);
  const size_t at = text.find(kMarker);
  ChatWrap wrap{text.substr(0, at), text.substr(at + kMarker.size())};
  const std::string& bos = chat_template.bos_token;
  if (engine_adds_bos && !bos.empty() && wrap.before.compare(0, bos.size(), bos) == 0) {
    wrap.before.erase(0, bos.size());
  }
  return wrap;
}

StatusOr<ModelDescription> DescribeModel(const std::string& spec) {
  ModelDescription d;
  VTOKEN_ASSIGN_OR_RETURN(d.path, ResolveModelPath(spec));
  if (IsModelFile(d.path)) {
    // The tensor types only: the file was validated when the model was read.
    VTOKEN_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Open(d.path));
    d.format = "gguf";
    d.quantization = GgufTypeMix(file);
    return d;
  }
  VTOKEN_ASSIGN_OR_RETURN(Checkpoint checkpoint, LoadCheckpoint(d.path));
  d.format = "safetensors";
  std::map<std::string, int64_t> counts;
  for (const SafetensorsFile& f : checkpoint.files()) {
    for (const TensorView& t : f.tensors()) ++counts[DTypeName(t.dtype)];
  }
  for (const auto& [dtype, n] : counts) {
    d.quantization += (d.quantization.empty() ? "" : ", ") + dtype + " x" + std::to_string(n);
  }
  return d;
}

}  // namespace vtoken::model
