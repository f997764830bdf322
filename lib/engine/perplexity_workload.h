// Perplexity workloads (kind perplexity): segments of context_tokens tokens of the corpus, each
// from the start of a random line; the first token is the prompt and the others are teacher-forced
// (Request::forced_tokens), as the StreamingLLM paper's long-text evaluation.
//
// Thread-safe: pure functions.
#pragma once

#include <vector>

#include "lib/core/status.h"
#include "lib/engine/workload.h"
#include "lib/model/io/tokenizer.h"

namespace vtoken::engine {

// The requests of kind perplexity, with their arrivals; drawn from WorkloadStream::kPrompts.
// REQUIRES: ValidateWorkloadOptions(o).ok(), kind perplexity. Errors: InvalidArgument for no
// corpus or context_tokens above max_total_tokens (> 0); those of CorpusText.
StatusOr<std::vector<Request>> PerplexityRequests(const WorkloadOptions& o,
                                                  const model::Tokenizer& tokenizer);

}  // namespace vtoken::engine
