// WorkloadOptions: what an engine run's workload is (workload.h says what each kind generates),
// with its validation and its memory estimate, and the pieces every kind's generator shares: the
// random streams derived from the seed and the one form of a bad option's error.
//
// Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lib/core/status.h"
#include "lib/engine/tasks.h"

namespace vtoken::engine {

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
  //                                                      prompt, the gpt turn after it the
  //                                                      reference;
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
  // task: tokens each request may generate; 0 = the task's own (TaskInstance::max_tokens).
  int64_t answer_tokens = 0;

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

// Independent random streams derived from WorkloadOptions::seed (Rng's `stream`): changing how
// one thing is drawn keeps the others' draws.
enum class WorkloadStream : uint64_t { kLengths = 1, kPrompts = 2, kArrivals = 3 };

// Returns InvalidArgument "workload option <field> = <value>: <why>".
Status WorkloadOptionError(const std::string& field, const std::string& value,
                           const std::string& why);

// The field a WorkloadOptionError names ("input_max"), or "" for any other status: a caller that
// knows where the field came from (a config file's line) can say so.
std::string WorkloadOptionField(const Status& status);

// The task generator's options of kind task (task, context_tokens, filler, corpus_path).
TaskOptions TaskOptionsOf(const WorkloadOptions& options);

}  // namespace vtoken::engine
