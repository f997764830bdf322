#include "lib/engine/task_workload.h"

#include <string>
#include <utility>

#include "lib/engine/arrivals.h"

namespace vtoken::engine {

// kind task: instance i at depths[i % size]; with chat the template wraps context and question
// (query-agnostic: the question and the template's end become question_tokens).
StatusOr<std::vector<Request>> TaskRequests(const WorkloadOptions& o,
                                            const model::Tokenizer& tokenizer) {
  const std::vector<int32_t> before =
      o.chat ? tokenizer.Encode(o.chat_prefix) : std::vector<int32_t>{};
  const std::vector<int32_t> after =
      o.chat ? tokenizer.Encode(o.chat_suffix) : std::vector<int32_t>{};
  std::vector<Request> requests;
  for (int64_t i = 0; i < o.num_requests; ++i) {
    const double depth = o.depths[static_cast<size_t>(i) % o.depths.size()];
    VTOKEN_ASSIGN_OR_RETURN(TaskInstance t,
                            MakeTaskInstance(TaskOptionsOf(o), tokenizer, o.seed, i, depth));
    Request r;
    r.id = i;
    r.max_tokens = o.answer_tokens > 0 ? o.answer_tokens : t.max_tokens;
    r.prompt_tokens = before;
    r.prompt_tokens.insert(r.prompt_tokens.end(), t.context_ids.begin(), t.context_ids.end());
    std::vector<int32_t>& question =
        o.protocol == TaskProtocol::kQueryAgnostic ? r.question_tokens : r.prompt_tokens;
    question.insert(question.end(), t.question_ids.begin(), t.question_ids.end());
    question.insert(question.end(), after.begin(), after.end());
    r.prompt =
        (o.chat ? o.chat_prefix : "") + t.context + t.question + (o.chat ? o.chat_suffix : "");
    const int64_t total =
        static_cast<int64_t>(r.prompt_tokens.size() + r.question_tokens.size()) + r.max_tokens;
    if (o.max_total_tokens > 0 && total > o.max_total_tokens) {
      return WorkloadOptionError("context_tokens", std::to_string(o.context_tokens),
                                 "request " + std::to_string(i) + " needs " +
                                     std::to_string(total) +
                                     " tokens with the chat template and its answer, more than "
                                     "max_total_tokens = " +
                                     std::to_string(o.max_total_tokens));
    }
    r.task = Request::Task{.name = t.task,
                           .context_tokens = o.context_tokens,
                           .depth = t.depth,
                           .needle_depth = t.needle_depth,
                           .expected = t.expected,
                           .scoring = t.scoring,
                           .question = t.question};
    requests.push_back(std::move(r));
  }
  AssignArrivals(o, requests);
  return requests;
}

}  // namespace vtoken::engine
