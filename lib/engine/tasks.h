// Long-context tasks with a right answer (workload kind "task"): passkey retrieval and the RULER
// tasks that need no dataset, generated offline and deterministically from a seed, sized in the
// model's own tokens. Each instance is a context (an instruction and a haystack holding what the
// question asks for) and a question; the engine feeds them in one of two protocols
// (TaskProtocol). Scoring follows RULER: the share of the expected strings present in the output.
//
// Tasks (TaskNames()):
//   passkey            a 5-digit pass key in repeated filler sentences ("The grass is green. ...");
//   niah_single        one "special magic number" (7 digits) for a key, in the haystack;
//   niah_multikey      the same among 3 distractor needles with other keys;
//   niah_multivalue    4 numbers for one key, all expected;
//   variable_tracking  a chain VAR A = 12345, VAR B = VAR A, ... (4 hops); every name expected;
//   common_words       a numbered word list; the 10 words that appear most often expected;
//   frequent_words     coded words drawn from a Zipf distribution; the 3 most frequent expected.
// The niah haystack is filler sentences ("repeat") or text from a corpus file ("corpus": words
// from a random line on, verse numbers and headings dropped). Keys are adjective-noun pairs of
// English words, coded and listed words pronounceable pseudo-words: no word list is read.
//
// Lengths: context_tokens is the token count of the instance's text (context plus question,
// without the chat template around it) in the tokenizer given: the generator fills the haystack
// (a filler sentence, a word or a list entry at a time) until the text holds between
// context_tokens - MaxShortfall(context_tokens) and context_tokens tokens: within 1% from 1,600
// tokens on. A needle at depth d starts after about d of the haystack's tokens (within one
// haystack unit).
//
// The haystack's filler: task_filler.h; keys, numbers and pseudo-words: task_words.h; scoring:
// task_scoring.h.
//
// Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lib/core/status.h"
#include "lib/engine/task_scoring.h"
#include "lib/model/io/tokenizer.h"

namespace vtoken::engine {

// When the question enters the cache.
enum class TaskProtocol {
  // The prompt is the context then the question, prefilled together; the policy's first eviction
  // sees the question (what a serving engine sees).
  kQuestionAware,
  // The context is prefilled and evicted first; the question is then appended, prefilled without
  // eviction, and answered (kvpress's protocol; what matters when a cache is reused).
  kQueryAgnostic,
};
const char* TaskProtocolName(TaskProtocol p);
StatusOr<TaskProtocol> ParseTaskProtocol(std::string_view name);

struct TaskOptions {
  std::string task = "passkey";  // one of TaskNames()
  int64_t context_tokens = 2048;
  // "repeat" (filler sentences) or "corpus" (text of corpus_path). passkey always repeats.
  std::string filler = "repeat";
  std::string corpus_path;
};

// The task names, in the order the docs list them.
const std::vector<std::string>& TaskNames();

// Whether `task` places its answer at a depth (niah_*, passkey, variable_tracking); the list
// tasks spread their answer over the whole context.
bool TaskHasDepth(std::string_view task);

struct TaskInstance {
  std::string task;
  std::string context;   // the instruction and the haystack; ends with "\n\n"
  std::string question;  // what is asked
  // The tokens of context and of question, each encoded on its own: both protocols feed the same
  // ids, the question's after the context's.
  std::vector<int32_t> context_ids, question_ids;
  std::vector<std::string> expected;  // what the output must contain
  TaskScoring scoring = TaskScoring::kAll;
  int64_t max_tokens = 0;  // enough for the answer and a short sentence around it
  // The depth asked for and the one reached: the first token of the (target) needle after
  // this share of the haystack's tokens. nullopt for tasks without a depth.
  std::optional<double> depth;
  std::optional<double> needle_depth;
};

// The most tokens an instance may fall short of context_tokens: 1% of it, at least 16 (one unit
// of the haystack may be longer than 1% of a short context).
inline constexpr int64_t kMinShortfall = 16;
int64_t MaxShortfall(int64_t context_tokens);

// Returns OK or InvalidArgument naming the bad field (unknown task or filler, a corpus filler
// without a file, context_tokens below 128 or above kMaxRequestTokens).
Status ValidateTaskOptions(const TaskOptions& options);

// Builds instance `index` of the task for `seed` at `depth` (in [0, 1]; ignored by tasks without
// a depth). Deterministic: the same arguments and tokenizer give the same instance.
// Errors: InvalidArgument from ValidateTaskOptions, or when context_tokens cannot hold the task's
// fixed text plus a haystack of 32 tokens; NotFound / DataLoss for an unreadable or empty corpus.
StatusOr<TaskInstance> MakeTaskInstance(const TaskOptions& options,
                                        const model::Tokenizer& tokenizer, uint64_t seed,
                                        int64_t index, double depth);

}  // namespace vtoken::engine
