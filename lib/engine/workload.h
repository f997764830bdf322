// Workloads: the requests an engine run serves (DESIGN.md §7). A workload is a pure function of
// its WorkloadOptions (and the tokenizer, corpus or JSONL file it reads): the same options give
// the same requests, token for token, on every platform. Randomness comes from a fixed PRNG
// (xoshiro256**) with hand-written transforms, not from <random>'s distributions, whose output
// differs between standard libraries.
//
// Kinds:
//   sharegpt_like   short chat-like requests: input and output lengths lognormal with the given
//                   means and log-space sigma (ShareGPT's lengths are long-tailed).
//   longbench_like  long-context requests: input uniform in [input_min, input_max], output
//                   uniform in [output_min, output_max].
//   jsonl           requests read from a file (format at GenerateWorkload).
//   task            long-context tasks with a right answer (tasks.h): passkey, needle in a
//                   haystack, variable tracking, common / frequent words.
//   perplexity      segments of context_tokens tokens of the corpus, from a random line each:
//                   the first token is the prompt, the rest is teacher-forced token by token
//                   (Request::forced_tokens), as the StreamingLLM paper's long-text evaluation.
// For the synthetic kinds, prompts are random token ids when there is no tokenizer (synthetic
// models) and text drawn from a corpus otherwise.
//
// Options, their validation and memory estimate: workload_options.h.
//
// Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lib/core/status.h"
#include "lib/engine/tasks.h"
#include "lib/engine/workload_options.h"
#include "lib/model/io/tokenizer.h"

namespace vtoken::engine {

struct Request {
  int64_t id = 0;  // 0, 1, 2, ... in arrival order
  // The prompt as text: what the tokens decode to. Empty when there is no tokenizer.
  std::string prompt;
  // The prompt the engine feeds the model (no BOS: the engine prepends one if the model wants
  // it). Authoritative: re-encoding `prompt` need not give the same ids.
  std::vector<int32_t> prompt_tokens;
  int64_t max_tokens = 0;                // tokens to generate (the engine may stop earlier at EOS)
  std::optional<std::string> reference;  // expected output, when the workload has one
  double arrival_s = 0.0;                // seconds from the start of the run
  // Requests of one group (>= 0) share their first shared_prefix_tokens prompt tokens; -1: none.
  int32_t prefix_group = -1;
  int64_t shared_prefix_tokens = 0;
  // jsonl: the prompt's length in tokens before it was cut to fit max_total_tokens; 0 when it
  // was not cut.
  int64_t truncated_from = 0;
  // Query-agnostic tasks: tokens the engine appends once the prompt is prefilled and evicted,
  // and prefills without eviction before the first output (the question and the chat template's
  // end). Empty otherwise.
  std::vector<int32_t> question_tokens;
  // Teacher forcing (kind perplexity): the output is these tokens, not sampled ones; the engine
  // records each one's log-probability (RequestResult::token_logprobs). max_tokens equals their
  // count, and EOS does not stop them.
  std::vector<int32_t> forced_tokens;
  // Task requests: what the output is scored against (ScoreTaskOutput).
  struct Task {
    std::string name;
    int64_t context_tokens = 0;                 // tokens of context and question, as asked
    std::optional<double> depth, needle_depth;  // asked and reached (TaskInstance)
    std::vector<std::string> expected;
    TaskScoring scoring = TaskScoring::kAll;
    std::string question;  // the end of `prompt` (before the chat template's end)
  };
  std::optional<Task> task;
};

// Generates the requests of `options`.
//
// Synthetic kinds: with `tokenizer` == nullptr prompts are uniform random ids in [0,
// vocab_size); otherwise each prompt (and each shared prefix) is text starting at a random line
// of corpus_path, encoded and cut to exactly the sampled number of tokens (the corpus wraps
// around when a prompt needs more text than follows the start line).
//
// jsonl (needs a tokenizer): one JSON object per line, blank lines skipped, either
//   {"prompt": str, "max_tokens": int?, "reference": str?}
// or ShareGPT's
//   {"conversations": [{"from": "human", "value": str}, {"from": "gpt", "value": str}, ...]}
// where the prompt is the first human (or "user") turn, the reference the gpt ("assistant",
// "chatgpt") turn right after it, and max_tokens its token count (jsonl_default_max_tokens
// without one).
//
// With options.chat, each prompt is wrapped as WorkloadOptions::chat says (after any cut).
//
// Errors: InvalidArgument from ValidateWorkloadOptions, or a bad vocab_size / missing
// tokenizer (chat needs one, and a chat_prefix or chat_suffix); NotFound for an unreadable corpus
// or JSONL file; DataLoss for a malformed JSONL line or an empty corpus (naming the file and
// 1-based line number).
StatusOr<std::vector<Request>> GenerateWorkload(const WorkloadOptions& options,
                                                const model::Tokenizer* tokenizer,
                                                int64_t vocab_size);

}  // namespace vtoken::engine
