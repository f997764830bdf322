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
// Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lib/core/status.h"
#include "lib/engine/tasks.h"
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
    int64_t context_tokens = 0;  // tokens of context and question, as asked
    std::optional<double> depth, needle_depth;  // asked and reached (TaskInstance)
    std::vector<std::string> expected;
    TaskScoring scoring = TaskScoring::kAll;
    std::string question;  // the end of `prompt` (before the chat template's end)
  };
  std::optional<Task> task;
};

struct WorkloadOptions {
  // "sharegpt_like" | "longbench_like" | "jsonl" | "task" | "perplexity".
  std::string kind = "sharegpt_like";
  // Requests to generate; for jsonl the most to read from the file (0 = all of it).
  int64_t num_requests = 64;
  // Seeds every random choice (lengths, prompts, arrivals; each has its own stream, so changing
  // the arrival process keeps the prompts).
  uint64_t seed = 1;

  // sharegpt_like: lognormal lengths with these means (tokens) and log-space standard
  // deviation; each length is rounded and at least 1.
  double input_mean = 230.0;
  double output_mean = 200.0;
  double length_sigma = 0.8;

  // longbench_like: uniform integer lengths in these inclusive ranges (tokens).
  int64_t input_min = 2048;
  int64_t input_max = 16384;
  int64_t output_min = 128;
  int64_t output_max = 512;

  // If > 0, a request whose input + output exceeds this (e.g. the model's context length) has
  // both scaled down proportionally to fit exactly: input' = floor(input * max / (input +
  // output)), output' = max - input'. A jsonl prompt is cut to its first input' tokens. Must be
  // 0 or >= 2.
  int64_t max_total_tokens = 0;

  // "all" (every request at t = 0) | "poisson" (exponential gaps) | "gamma" (gamma-distributed
  // gaps: shape 1 / gamma_cv^2, mean 1 / rate; cv > 1 is burstier than Poisson). The first
  // request arrives at t = 0; `rate` (requests/s) sets the mean gap after it.
  std::string arrival = "all";
  double rate = 1.0;
  double gamma_cv = 1.0;

  // Synthetic kinds: consecutive groups of this many requests (ids g*d .. g*d+d-1) share a prompt
  // prefix of floor(shared_prefix_fraction * the group's shortest prompt) tokens; the tokens right
  // after the prefix differ between members. 1 = no sharing. Typical: 1, 2, 4, 8.
  int32_t prefix_sharing_degree = 1;
  double shared_prefix_fraction = 0.75;  // in [0, 1)

  // jsonl: the file to read. One JSON object per line in any of three formats, or one JSON array
  // of such objects (ShareGPT's released .json files):
  //   {"prompt", "max_tokens"?, "reference"?}           the simple format (any line with a
  //                                                      "prompt", e.g. `vtoken-cli tasks`'s);
  //   {"conversations": [{"from", "value"}, ...]}        ShareGPT: the first human turn is the
  //                                                      prompt, the gpt turn after it the reference;
  //   {"context", "input", "answers"?, "dataset"?, ...}  LongBench (no "prompt"): the prompt is
  //                                                      prompt_template with {context} and
  //                                                      {input} filled in, the reference
  //                                                      answers[0].
  std::string jsonl_path;
  int64_t jsonl_default_max_tokens = 256;  // jsonl: max_tokens when a line does not give one
  // LongBench lines: the prompt, with {context} and {input} replaced (each at most once).
  std::string prompt_template = "{context}\n\nQuestion: {input}\nAnswer:";
  // jsonl: how a prompt longer than max_total_tokens allows is cut: "end" keeps its beginning,
  // "middle" keeps its first and last halves (LongBench's truncation).
  std::string truncate = "end";
  // Synthetic kinds with a tokenizer: plain text file that prompts are drawn from (and the niah
  // tasks' haystack with filler "corpus").
  std::string corpus_path;

  // task: which task (TaskNames()), its length in the model's tokens (the text of context and
  // question, without the chat template), the needle depths (request i is at
  // depths[i % size], each in [0, 1]; ignored by the list tasks), the niah haystack's filler
  // ("repeat" or "corpus") and when the question enters the cache. Each request's max_tokens is
  // the task's (TaskInstance::max_tokens); a request longer than max_total_tokens (> 0) is an
  // error, never cut.
  std::string task = "passkey";
  int64_t context_tokens = 2048;
  std::vector<double> depths = {0.0, 0.25, 0.5, 0.75, 1.0};
  std::string filler = "repeat";
  TaskProtocol protocol = TaskProtocol::kQuestionAware;

  // Wrap every prompt as a user turn of the model's chat template (config key workload.chat),
  // so an instruct model answers instead of continuing the text. The caller renders the template
  // around the content and sets the two texts below (GenerateWorkload refuses chat without them):
  // each prompt's tokens become Encode(chat_prefix) + the prompt's tokens + Encode(chat_suffix).
  // Lengths (input_*, max_total_tokens, jsonl truncation) count the content; the template's
  // tokens come on top, and a shared prefix grows by chat_prefix's tokens.
  bool chat = false;
  std::string chat_prefix;  // e.g. "<|im_start|>system\n...<|im_end|>\n<|im_start|>user\n"
  std::string chat_suffix;  // e.g. "<|im_end|>\n<|im_start|>assistant\n"
};

// The most tokens any one length (input, output, total, a JSONL max_tokens) and the most
// requests a workload may have: every sum of them fits in int64_t.
inline constexpr int64_t kMaxRequestTokens = 2147483647;

// Returns OK or InvalidArgument naming the first bad field and its value.
Status ValidateWorkloadOptions(const WorkloadOptions& options);

// Bytes the requests of `options` take in memory, through a run that keeps every prompt, output
// and step record (an estimate from the longest or mean lengths; jsonl from the file size).
// REQUIRES: ValidateWorkloadOptions(options).ok().
int64_t WorkloadBytes(const WorkloadOptions& options);

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
