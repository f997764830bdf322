// Byte-level BPE training (the algorithm of Hugging Face's BpeTrainer, single-threaded).
//
// The corpus is cut into pre-tokens with the Llama 3 split regex (special tokens are split out
// first and never learned from); distinct pre-tokens are counted, and merges are learned greedily
// from pair counts that are updated incrementally, touching only the words that contain the pair
// being merged. Ties between equally frequent pairs go to the pair with the smaller token ids,
// so training is deterministic.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "lib/core/status.h"
#include "lib/model/io/tokenizer.h"

namespace vtoken::model {

// Trains a tokenizer with exactly `vocab_size` ids (fewer only if the corpus runs out of pairs):
// ids 0..255 are the single bytes in byte order, then one id per learned merge, then
// `special_tokens` as added tokens, in the given order (Llama 3 layout).
// Errors: kInvalidArgument if vocab_size < 256 + special_tokens.size(), or a special token is
// empty, duplicated or not valid UTF-8.
StatusOr<Tokenizer> TrainByteLevelBpe(std::string_view corpus, int vocab_size,
                                      std::vector<std::string> special_tokens);

}  // namespace vtoken::model
