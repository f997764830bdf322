// Tokenizer: byte-level BPE as used by GPT-2, Llama 3, Qwen2 and SmolLM2, loaded from (and saved
// to) a Hugging Face tokenizer.json, or built from GGUF metadata (gguf_tokenizer.h).
//
// Encoding: added tokens (e.g. "<|begin_of_text|>") are split out of the text first and emitted
// as their ids; every other segment is cut into pre-tokens by the split regex (pretokenizer.h),
// each pre-token's bytes are mapped to GPT-2's byte-level alphabet and merged by BPE in merge-rank
// order. Encode adds no BOS/EOS; callers prepend bos_id() themselves when the model wants one.
//
// Supported tokenizer.json subset: model BPE (vocab, merges as "a b" strings or [a, b] arrays,
// ignore_merges, unk_token); pre_tokenizer ByteLevel(use_regex: true) with the GPT-2 regex, or
// Sequence[Split(Regex, Isolated), ByteLevel(use_regex: false)] with the GPT-2, Llama 3 or Qwen2
// regex, or Sequence[Digits(individual_digits: true), ByteLevel(use_regex: true)] (SmolLM2);
// decoder ByteLevel; normalizer null or NFC (NFC is treated as the identity: input is
// assumed to be NFC already, as nearly all text is); post_processor is read only for the token
// it puts before a single sequence (TemplateProcessing's leading special token,
// RobertaProcessing's and BertProcessing's cls; see PromptBosId). BPE dropout is ignored
// (inference is deterministic).
//
// A Tokenizer is immutable after construction; all const methods are safe to call concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lib/core/status.h"
#include "lib/model/io/hf_config.h"
#include "lib/model/io/pretokenizer.h"

namespace vtoken::model {

// A token matched verbatim in the input before pre-tokenization and never merged.
struct AddedToken {
  int32_t id = 0;
  std::string content;  // Raw UTF-8 text, not byte-level mapped.
  bool special = true;
};

// Everything a Tokenizer is made of; what Load parses and Save writes.
struct TokenizerSpec {
  // Byte-level token strings (GPT-2 alphabet, e.g. "Ġthe") and their ids. Ids are unique.
  std::vector<std::pair<std::string, int32_t>> vocab;
  // Merges in rank order (rank 0 merges first); both halves and their concatenation must be in
  // the vocab.
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<AddedToken> added_tokens;
  SplitPattern pattern = SplitPattern::kLlama3;
  // ByteLevel add_prefix_space: a space is prepended to each text segment not starting with one.
  // Only supported with the GPT-2 form (ByteLevel doing the regex split itself).
  bool add_prefix_space = false;
  // Llama 3: a whole pre-token that is in the vocab is emitted directly, without merging.
  bool ignore_merges = false;
  // Emitted for a byte whose single-byte token is missing from the vocab; if unset such bytes
  // are dropped (as Hugging Face does).
  std::optional<std::string> unk_token;
  // The token the post_processor puts before a single sequence (TemplateProcessing,
  // RobertaProcessing, BertProcessing), if any. Save writes it as a TemplateProcessing.
  std::optional<std::string> bos_token;
  // Ids named explicitly by the source (GGUF's tokenizer.ggml.bos_token_id, eos_token_id,
  // eot_token_id); when set they win over the by-name rules of bos_id(), eos_id() and eot_id().
  // Each must name a token. Save does not write them: tokenizer.json has no place for them.
  std::optional<int32_t> bos_id;
  std::optional<int32_t> eos_id;
  std::optional<int32_t> eot_id;
};

class Tokenizer {
 public:
  // Reads a tokenizer.json. Errors (each naming the file): kNotFound if it cannot be read,
  // kDataLoss if it is not valid JSON or a field has the wrong type, kInvalidArgument for an
  // unsupported model/pre_tokenizer/decoder or a merge referring to an unknown token.
  static StatusOr<Tokenizer> Load(const std::string& path);

  // Builds a tokenizer from parts. kInvalidArgument names the first inconsistency (duplicate id,
  // merge with an unknown token, added token id clashing with a different vocab token).
  static StatusOr<Tokenizer> Create(TokenizerSpec spec);

  // Writes a tokenizer.json that Hugging Face `tokenizers` and Load both read: model BPE,
  // Sequence[Split(regex, Isolated), ByteLevel] pre-tokenizer (SmolLM: Sequence[Digits,
  // ByteLevel]), ByteLevel decoder, added_tokens.
  Status Save(const std::string& path) const;

  // Returns the token ids of `text` (any bytes; invalid UTF-8 is encoded byte by byte). Added
  // tokens are matched leftmost-longest. Without `parse_special` only the non-special added tokens
  // are matched and a special token's text is encoded as plain text (llama.cpp's
  // parse_special=false; Hugging Face's split_special_tokens=True).
  std::vector<int32_t> Encode(std::string_view text, bool parse_special = true) const;

  // Returns the bytes the ids stand for (added tokens as their content). Ids that name no token
  // are skipped, and with `skip_special` so are special added tokens (<|end_of_text|>, ...), as
  // Hugging Face's decode(skip_special_tokens=True). Decode(Encode(x)) == x whenever all 256
  // single-byte tokens are in the vocab.
  std::string Decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // One more than the largest id of any vocab or added token.
  int32_t vocab_size() const { return static_cast<int32_t>(id_to_bytes_.size()); }
  int32_t num_merges() const { return static_cast<int32_t>(spec_.merges.size()); }
  const TokenizerSpec& spec() const { return spec_; }

  // Id of an added token (by content) or vocab token (by byte-level string), or nullopt.
  std::optional<int32_t> TokenId(std::string_view token) const;

  // Each is spec()'s explicit id when set. Else BOS: the post_processor's template token, else an
  // added token named <|begin_of_text|>, <s> or <bos>. EOS: an added token named <|end_of_text|>,
  // <|endoftext|>, </s> or <eos>. EOT (the chat template's end of a turn): an added token named
  // <|eot_id|>, <|im_end|>, <|end|> or <end_of_turn>.
  std::optional<int32_t> bos_id() const { return bos_id_; }
  // The post_processor's token before a single sequence (spec().bos_token), or nullopt when the
  // post_processor adds none: what Hugging Face's encode(add_special_tokens=True) prepends.
  std::optional<int32_t> template_bos_id() const { return template_bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }
  std::optional<int32_t> eot_id() const { return eot_id_; }

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

 private:
  struct Index;  // Hash maps for encoding, built once by Create.

  Tokenizer(TokenizerSpec spec, std::unique_ptr<Index> index);
  // Appends the ids of one pre-token (raw bytes) to `out`.
  void EncodePreToken(std::string_view piece, std::vector<int32_t>& out) const;

  TokenizerSpec spec_;
  std::unique_ptr<Index> index_;
  std::vector<std::string> id_to_bytes_;  // Decoded bytes per id; empty for unused ids.
  std::vector<bool> id_used_;
  std::vector<bool> id_special_;
  std::optional<int32_t> bos_id_;
  std::optional<int32_t> eos_id_;
  std::optional<int32_t> eot_id_;
  std::optional<int32_t> template_bos_id_;
};

// The BOS the engine prepends to every prompt, as Hugging Face encodes one: with a tokenizer, the
// post_processor decides (template_bos_id(); a Qwen2-style tokenizer without a BOS template gets
// none, whatever config.json says); without one (synthetic and sim: models) config.json's
// bos_token_id.
std::optional<int32_t> PromptBosId(const Tokenizer* tokenizer, const ModelConfig& config);

// PromptBosId for a model directory, as ModelConfig::bos_token_ids (empty or one id): reads
// `model_dir`/tokenizer.json when there is one. Errors are Tokenizer::Load's.
StatusOr<std::vector<int64_t>> PromptBosTokenIds(const std::string& model_dir,
                                                 const ModelConfig& config);

}  // namespace vtoken::model
