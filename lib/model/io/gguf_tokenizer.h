// A Tokenizer built from GGUF metadata (llama.cpp's tokenizer.ggml.* keys), encoding and decoding
// as llama.cpp's llama_tokenize(parse_special) and llama_token_to_piece do. Only
// tokenizer.ggml.model "gpt2" (byte-level BPE) is supported.
//
// Keys read: tokenizer.ggml.model, .pre, .tokens (byte-level strings such as "Ġthe"; control and
// user-defined tokens as their raw text), .merges ("a b" in rank order), .token_type (optional:
// 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte), .bos_token_id,
// .eos_token_id, .eot_token_id (all optional), .add_bos_token (optional; default as llama.cpp's
// for the pre-tokenizer). tokenizer.ggml.unknown_token_id and .padding_token_id are not needed to
// encode or decode and are ignored.
//
// Token types, as llama.cpp's vocabulary treats them:
//   normal, unused   vocab tokens, reached by BPE merges only;
//   control, unknown special added tokens: matched verbatim in the text only with parse_special
//                    (Tokenizer::Encode's default), skipped by Decode(skip_special);
//   user-defined     non-special added tokens: matched verbatim in the text whether or not
//                    parse_special is set (llama.cpp's tokenizer_st_partition always splits them
//                    out, as Hugging Face does for non-special added tokens), always decoded;
//   byte             rejected (SentencePiece's "<0xNN>" tokens have no place in byte-level BPE).
// Differences from llama.cpp. In the vocabulary, none of which SmolLM2's file has: overlapping
// added tokens are matched leftmost-longest (llama.cpp splits out the longest token everywhere
// first); an unused token decodes to its text (llama.cpp: to nothing); tokens llama.cpp promotes
// to control by name (an <|im_end|> typed normal) keep their type; the EOT by name does not
// consider <|endoftext|>; without bos_token_id there is no BOS (llama.cpp: id 11);
// tokenizer.ggml.add_eos_token is not read (the engine appends no EOS). In text: the Unicode
// classes of the split are approximated (pretokenizer.h; digits of some scripts are missed);
// Decode gives the tokens' exact bytes, never llama_detokenize's clean-up of spaces before
// punctuation (which llama.cpp applies for "gpt-2" and "llama3", not "smollm" or "qwen2").
//
// Thread safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "lib/core/status.h"
#include "lib/model/io/chat_template.h"
#include "lib/model/io/gguf.h"
#include "lib/model/io/pretokenizer.h"
#include "lib/model/io/tokenizer.h"

namespace vtoken::model {

// What a tokenizer.ggml.pre name means to llama.cpp, where we can match it.
struct GgufPreTokenizer {
  SplitPattern pattern;
  bool ignore_merges;    // A whole pre-token in the vocab is emitted without merging (Llama 3).
  bool add_bos_default;  // add_bos_token when the file does not say.
};

// The pre-tokenizer llama.cpp's llama-vocab.cpp selects for `pre`, or nullopt for a name whose
// split we cannot match (including "default": punctuation runs, GPT-2's regex, digit runs and
// digit triples, in that order, which is none of ours). Known: "gpt-2"; "llama3", "llama-v3",
// "llama-bpe"; "qwen2", "deepseek-r1-qwen"; "smollm", "starcoder".
std::optional<GgufPreTokenizer> GgufPreTokenizerFromName(std::string_view pre);

// Builds the tokenizer of a GGUF file's `metadata`. The result's template_bos_id() is the BOS id
// iff add_bos_token (what the engine prepends to a prompt, as llama.cpp's tokenize(add_special)
// does), bos_id()/eos_id()/eot_id() are the file's ids (EOT: tokenizer.ggml.eot_token_id, else the
// token named <|eot_id|>, <|im_end|>, <|end|> or <end_of_turn>). Errors are one line starting
// with `name_for_errors`: InvalidArgument for a tokenizer.ggml.model other than "gpt2", a missing
// tokenizer.ggml.pre or a name GgufPreTokenizerFromName does not know, a byte token, a malformed
// merge or one naming an unknown token, a token type outside 1..6, an id key out of range,
// add_bos_token without bos_token_id, tokens and token_type of different lengths, or a duplicate
// token; the getters' errors (NotFound, InvalidArgument) for a missing or mistyped key.
StatusOr<Tokenizer> TokenizerFromGguf(const GgufMetadata& metadata,
                                      const std::string& name_for_errors);

// The file's tokenizer.chat_template recognized by ParseChatTemplate, with the BOS token's text
// (tokenizer.ggml.tokens[bos_token_id], if the key is there) as the template's bos_token. Errors
// start with `name_for_errors`: NotFound when the file has no template, else the getters' and
// ParseChatTemplate's.
StatusOr<ChatTemplate> ChatTemplateFromGguf(const GgufMetadata& metadata,
                                            const std::string& name_for_errors);

}  // namespace vtoken::model
