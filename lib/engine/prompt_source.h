// Prompt sources: where the synthetic kinds' (and perplexity's) prompt tokens come from, random
// ids for a synthetic model or text of a corpus file through the model's tokenizer, and
// DrawPrompts, which fills the synthetic kinds' prompts from one, in prefix groups
// (WorkloadOptions::prefix_sharing_degree).
//
// Not thread-safe: a source is used by one generator at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lib/core/status.h"
#include "lib/engine/request_lengths.h"
#include "lib/engine/rng.h"
#include "lib/engine/workload.h"
#include "lib/model/io/tokenizer.h"

namespace vtoken::engine {

// Draws prompt token ids: random ids, or corpus text through the tokenizer.
class PromptSource {
 public:
  virtual ~PromptSource() = default;
  // Returns exactly `n` tokens.
  virtual StatusOr<std::vector<int32_t>> Draw(Rng& rng, int64_t n) = 0;
};

// Uniform random ids in [0, vocab_size).
class RandomIds : public PromptSource {
 public:
  explicit RandomIds(int64_t vocab_size) : vocab_size_(vocab_size) {}
  StatusOr<std::vector<int32_t>> Draw(Rng& rng, int64_t n) override;

 private:
  int64_t vocab_size_;
};

// Text of a corpus file from the start of a random non-blank line, wrapping around at the end.
class CorpusText : public PromptSource {
 public:
  // Errors: NotFound for an unreadable file; DataLoss for one without text or not UTF-8 (or
  // holding a NUL byte). `tokenizer` must outlive the source.
  static StatusOr<std::unique_ptr<CorpusText>> Load(const std::string& path,
                                                    const model::Tokenizer& tokenizer);

  // Errors: DataLoss when the whole corpus, wrapped, does not encode to `n` tokens.
  StatusOr<std::vector<int32_t>> Draw(Rng& rng, int64_t n) override;

 private:
  CorpusText(std::string path, std::string text, const model::Tokenizer& tokenizer)
      : path_(std::move(path)), text_(std::move(text)), tokenizer_(tokenizer) {}

  // `bytes` characters of the corpus from `start`, wrapping around at the end.
  std::string Wrapped(size_t start, size_t bytes) const;

  std::string path_;
  std::string text_;
  const model::Tokenizer& tokenizer_;
  std::vector<size_t> line_starts_;
};

// Fills prompt_tokens (and prefix groups) of the synthetic kinds: request i gets lengths[i].input
// tokens of `source`, drawn from WorkloadStream::kPrompts; the members of a group share a prefix
// and differ in the token right after it. Errors: those of `source`, and InvalidArgument when no
// distinct continuations of a shared prefix turn up.
Status DrawPrompts(const WorkloadOptions& o, const std::vector<Lengths>& lengths,
                   PromptSource& source, std::vector<Request>& requests);

}  // namespace vtoken::engine
