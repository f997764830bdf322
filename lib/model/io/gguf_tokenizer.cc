#include "lib/model/io/gguf_tokenizer.h"

#include <cstdint>
#include <utility>
#include <vector>

namespace vtoken::model {
namespace {

// llama-vocab.cpp's names for the splits we match, with the flags it sets beside them.
struct PreName {
  std::string_view name;
  GgufPreTokenizer pre;
};
constexpr GgufPreTokenizer kGpt2Pre{SplitPattern::kGpt2, false, false};
constexpr GgufPreTokenizer kLlama3Pre{SplitPattern::kLlama3, true, true};
constexpr GgufPreTokenizer kQwen2Pre{SplitPattern::kQwen2, false, false};
constexpr GgufPreTokenizer kSmolLmPre{SplitPattern::kSmolLm, false, false};
constexpr PreName kPreNames[] = {
    {"gpt-2", kGpt2Pre},       {"llama3", kLlama3Pre},    {"llama-v3", kLlama3Pre},
    {"llama-bpe", kLlama3Pre}, {"qwen2", kQwen2Pre},      {"deepseek-r1-qwen", kQwen2Pre},
    {"smollm", kSmolLmPre},    {"starcoder", kSmolLmPre},
};

// llama.cpp's token types (llama_token_type).
enum TokenType : int64_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// Builds one tokenizer; every error starts with the file's name.
class GgufTokenizerBuilder {
 public:
  GgufTokenizerBuilder(const GgufMetadata& metadata, const std::string& name)
      : md_(metadata), name_(name) {}

  StatusOr<Tokenizer> Build() {
    VTOKEN_ASSIGN_OR_RETURN(std::string model, Named(md_.GetString("tokenizer.ggml.model")));
    if (model != "gpt2") {
      return Error("tokenizer.ggml.model '" + model +
                   "' is not supported (only 'gpt2', byte-level BPE)");
    }
    if (!md_.Has("tokenizer.ggml.pre")) {
      return Error("tokenizer.ggml.pre is missing (llama.cpp's 'default' split is not supported)");
    }
    VTOKEN_ASSIGN_OR_RETURN(std::string pre_name, Named(md_.GetString("tokenizer.ggml.pre")));
    std::optional<GgufPreTokenizer> pre = GgufPreTokenizerFromName(pre_name);
    if (!pre) return Error("tokenizer.ggml.pre '" + pre_name + "' is not supported");

    TokenizerSpec spec;
    spec.pattern = pre->pattern;
    spec.ignore_merges = pre->ignore_merges;
    VTOKEN_ASSIGN_OR_RETURN(tokens_, Named(md_.GetStringArray("tokenizer.ggml.tokens")));
    VTOKEN_RETURN_IF_ERROR(AddTokens(spec));
    VTOKEN_RETURN_IF_ERROR(AddMerges(spec));

    VTOKEN_ASSIGN_OR_RETURN(spec.bos_id, OptionalId("tokenizer.ggml.bos_token_id"));
    VTOKEN_ASSIGN_OR_RETURN(spec.eos_id, OptionalId("tokenizer.ggml.eos_token_id"));
    VTOKEN_ASSIGN_OR_RETURN(spec.eot_id, OptionalId("tokenizer.ggml.eot_token_id"));
    bool add_bos = pre->add_bos_default;
    if (md_.Has("tokenizer.ggml.add_bos_token")) {
      VTOKEN_ASSIGN_OR_RETURN(add_bos, Named(md_.GetBool("tokenizer.ggml.add_bos_token")));
    }
    if (add_bos) {
      if (!spec.bos_id)
        return Error("add_bos_token is true but tokenizer.ggml.bos_token_id is missing");
      spec.bos_token = tokens_[*spec.bos_id];
    }

    StatusOr<Tokenizer> tokenizer = Tokenizer::Create(std::move(spec));
    if (!tokenizer.ok()) return Error(tokenizer.status().message());
    return tokenizer;
  }

 private:
  Status Error(const std::string& what) const { return InvalidArgumentError(name_ + ": " + what); }

  template <typename T>
  StatusOr<T> Named(StatusOr<T> value) const {
    if (value.ok()) return value;
    return Status(value.status().code(), name_ + ": " + value.status().message());
  }

  // Vocab tokens and added tokens by type (see the header for the mapping).
  Status AddTokens(TokenizerSpec& spec) const {
    std::vector<int64_t> types(tokens_.size(), kNormal);
    if (md_.Has("tokenizer.ggml.token_type")) {
      VTOKEN_ASSIGN_OR_RETURN(types, Named(md_.GetIntArray("tokenizer.ggml.token_type")));
      if (types.size() != tokens_.size()) {
        return Error("tokenizer.ggml.token_type has " + std::to_string(types.size()) +
                     " entries for " + std::to_string(tokens_.size()) + " tokens");
      }
    }
    spec.vocab.reserve(tokens_.size());
    for (size_t i = 0; i < tokens_.size(); ++i) {
      const auto id = static_cast<int32_t>(i);
      switch (types[i]) {
        case kNormal:
        case kUnused:
          spec.vocab.emplace_back(tokens_[i], id);
          break;
        case kUnknown:
        case kControl:
          spec.added_tokens.push_back({id, tokens_[i], /*special=*/true});
          break;
        case kUserDefined:
          spec.added_tokens.push_back({id, tokens_[i], /*special=*/false});
          break;
        case kByte:
          return Error("token " + std::to_string(i) + " '" + tokens_[i] +
                       "' is a byte token (type 6), which byte-level BPE does not use");
        default:
          return Error("token " + std::to_string(i) + " '" + tokens_[i] + "' has type " +
                       std::to_string(types[i]) + " (not 1..6)");
      }
    }
    return Status::Ok();
  }

  Status AddMerges(TokenizerSpec& spec) const {
    VTOKEN_ASSIGN_OR_RETURN(std::vector<std::string> merges,
                            Named(md_.GetStringArray("tokenizer.ggml.merges")));
    spec.merges.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
      // As llama.cpp: the first space after the first byte separates the halves.
      const std::string& m = merges[i];
      size_t space = m.find(' ', 1);
      if (space == std::string::npos || space + 1 == m.size()) {
        return Error("tokenizer.ggml.merges[" + std::to_string(i) + "] '" + m +
                     "' is not two tokens separated by a space");
      }
      spec.merges.emplace_back(m.substr(0, space), m.substr(space + 1));
    }
    return Status::Ok();
  }

  // The id under `key` if the key is there; InvalidArgument when it names no token.
  StatusOr<std::optional<int32_t>> OptionalId(std::string_view key) const {
    if (!md_.Has(key)) return std::optional<int32_t>();
    VTOKEN_ASSIGN_OR_RETURN(int64_t id, Named(md_.GetInt(key)));
    if (id < 0 || id >= static_cast<int64_t>(tokens_.size())) {
      return Error(std::string(key) + " " + std::to_string(id) + " is outside the " +
                   std::to_string(tokens_.size()) + " tokens");
    }
    return std::optional<int32_t>(static_cast<int32_t>(id));
  }

  const GgufMetadata& md_;
  const std::string& name_;
  std::vector<std::string> tokens_;
};

}  // namespace

std::optional<GgufPreTokenizer> GgufPreTokenizerFromName(std::string_view pre) {
  for (const PreName& p : kPreNames) {
    if (p.name == pre) return p.pre;
  }
  return std::nullopt;
}

StatusOr<Tokenizer> TokenizerFromGguf(const GgufMetadata& metadata,
                                      const std::string& name_for_errors) {
  return GgufTokenizerBuilder(metadata, name_for_errors).Build();
}

StatusOr<ChatTemplate> ChatTemplateFromGguf(const GgufMetadata& metadata,
                                            const std::string& name_for_errors) {
  auto named = [&](const Status& s) {
    return Status(s.code(), name_for_errors + ": " + s.message());
  };
  StatusOr<std::string> jinja = metadata.GetString("tokenizer.chat_template");
  if (!jinja.ok()) return named(jinja.status());
  std::string bos_token;
  if (metadata.Has("tokenizer.ggml.bos_token_id")) {
    StatusOr<int64_t> bos = metadata.GetInt("tokenizer.ggml.bos_token_id");
    StatusOr<std::vector<std::string>> tokens = metadata.GetStringArray("tokenizer.ggml.tokens");
    if (!bos.ok()) return named(bos.status());
    if (!tokens.ok()) return named(tokens.status());
    if (*bos < 0 || *bos >= static_cast<int64_t>(tokens->size())) {
      return InvalidArgumentError(name_for_errors + ": tokenizer.ggml.bos_token_id " +
                                  std::to_string(*bos) + " is outside the " +
                                  std::to_string(tokens->size()) + " tokens");
    }
    bos_token = (*tokens)[*bos];
  }
  StatusOr<ChatTemplate> parsed = ParseChatTemplate(*jinja, bos_token);
  if (!parsed.ok()) return named(parsed.status());
  return parsed;
}

}  // namespace vtoken::model
