#include "lib/engine/perplexity_workload.h"

#include <memory>
#include <string>

#include "lib/engine/arrivals.h"
#include "lib/engine/prompt_source.h"
#include "lib/engine/rng.h"

namespace vtoken::engine {

// kind perplexity: a segment of context_tokens corpus tokens per request, from a random line;
// the first token is the prompt, the others are forced.
StatusOr<std::vector<Request>> PerplexityRequests(const WorkloadOptions& o,
                                                  const model::Tokenizer& tokenizer) {
  if (o.corpus_path.empty()) {
    return WorkloadOptionError("corpus", "\"\"", "required by kind perplexity (the text scored)");
  }
  if (o.max_total_tokens > 0 && o.context_tokens > o.max_total_tokens) {
    return WorkloadOptionError(
        "context_tokens", std::to_string(o.context_tokens),
        "more than max_total_tokens = " + std::to_string(o.max_total_tokens));
  }
  VTOKEN_ASSIGN_OR_RETURN(std::unique_ptr<PromptSource> source,
                          CorpusText::Load(o.corpus_path, tokenizer));
  Rng rng(o.seed, static_cast<uint64_t>(WorkloadStream::kPrompts));
  std::vector<Request> requests(static_cast<size_t>(o.num_requests));
  for (size_t i = 0; i < requests.size(); ++i) {
    Request& r = requests[i];
    r.id = static_cast<int64_t>(i);
    VTOKEN_ASSIGN_OR_RETURN(std::vector<int32_t> ids, source->Draw(rng, o.context_tokens));
    r.prompt_tokens.assign(ids.begin(), ids.begin() + 1);
    r.forced_tokens.assign(ids.begin() + 1, ids.end());
    r.max_tokens = static_cast<int64_t>(r.forced_tokens.size());
    r.prompt = tokenizer.Decode(r.prompt_tokens);
  }
  AssignArrivals(o, requests);
  return requests;
}

}  // namespace vtoken::engine
