#include "lib/engine/workload.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "lib/engine/arrivals.h"
#include "lib/engine/jsonl_workload.h"
#include "lib/engine/perplexity_workload.h"
#include "lib/engine/prompt_source.h"
#include "lib/engine/request_lengths.h"
#include "lib/engine/task_workload.h"

namespace vtoken::engine {

StatusOr<std::vector<Request>> GenerateWorkload(const WorkloadOptions& options,
                                                const model::Tokenizer* tokenizer,
                                                int64_t vocab_size) {
  VTOKEN_RETURN_IF_ERROR(ValidateWorkloadOptions(options));
  std::vector<Request> requests;
  if (options.kind == "task") {
    if (tokenizer == nullptr) {
      return InvalidArgumentError(
          "workload: kind task needs a model with a tokenizer (not a synthetic model): lengths "
          "are counted in its tokens");
    }
    if (options.chat && options.chat_prefix.empty() && options.chat_suffix.empty()) {
      return InvalidArgumentError(
          "workload.chat: no chat template was rendered around the prompts");
    }
    return TaskRequests(options, *tokenizer);
  }
  if (options.kind == "perplexity") {
    if (tokenizer == nullptr) {
      return InvalidArgumentError(
          "workload: kind perplexity needs a model with a tokenizer (not a synthetic model)");
    }
    return PerplexityRequests(options, *tokenizer);
  }
  if (options.kind == "jsonl") {
    if (tokenizer == nullptr) {
      return InvalidArgumentError("workload " + options.jsonl_path +
                                  ": kind jsonl needs a tokenizer (not a synthetic model)");
    }
    VTOKEN_ASSIGN_OR_RETURN(requests, ReadJsonl(options, *tokenizer));
  } else {
    std::unique_ptr<PromptSource> source;
    if (tokenizer == nullptr) {
      if (vocab_size < std::max<int64_t>(1, options.prefix_sharing_degree)) {
        return InvalidArgumentError(
            "vocab_size = " + std::to_string(vocab_size) + ": must be >= 1 and >= " +
            "prefix_sharing_degree (members' tokens after the shared prefix differ)");
      }
      source = std::make_unique<RandomIds>(vocab_size);
    } else {
      if (options.corpus_path.empty()) {
        return WorkloadOptionError("corpus_path", "\"\"",
                                   "required to draw prompts for a real tokenizer");
      }
      VTOKEN_ASSIGN_OR_RETURN(source, CorpusText::Load(options.corpus_path, *tokenizer));
    }
    const std::vector<Lengths> lengths = SampleLengths(options);
    requests.resize(lengths.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      requests[i].id = static_cast<int64_t>(i);
      requests[i].max_tokens = lengths[i].output;
    }
    VTOKEN_RETURN_IF_ERROR(DrawPrompts(options, lengths, *source, requests));
    if (tokenizer != nullptr) {
      for (Request& r : requests) r.prompt = tokenizer->Decode(r.prompt_tokens);
    }
  }
  if (options.chat) {
    if (tokenizer == nullptr) {
      return InvalidArgumentError(
          "workload.chat needs a model with a tokenizer and a chat template");
    }
    if (options.chat_prefix.empty() && options.chat_suffix.empty()) {
      return InvalidArgumentError(
          "workload.chat: no chat template was rendered around the prompts");
    }
    const std::vector<int32_t> before = tokenizer->Encode(options.chat_prefix);
    const std::vector<int32_t> after = tokenizer->Encode(options.chat_suffix);
    for (Request& r : requests) {
      std::vector<int32_t> wrapped = before;
      wrapped.insert(wrapped.end(), r.prompt_tokens.begin(), r.prompt_tokens.end());
      wrapped.insert(wrapped.end(), after.begin(), after.end());
      r.prompt_tokens = std::move(wrapped);
      r.prompt = options.chat_prefix + r.prompt + options.chat_suffix;
      if (r.prefix_group >= 0) r.shared_prefix_tokens += static_cast<int64_t>(before.size());
    }
  }
  AssignArrivals(options, requests);
  return requests;
}

}  // namespace vtoken::engine
