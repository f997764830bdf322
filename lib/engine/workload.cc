#include "lib/engine/workload.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <numbers>
#include <set>
#include <sstream>
#include <string_view>
#include <utility>

#include "lib/core/memory_budget.h"
#include "lib/engine/rng.h"

namespace vtoken::engine {
namespace {

using Json = nlohmann::json;

// Independent random streams derived from the one seed.
enum class Stream : uint64_t { kLengths = 1, kPrompts = 2, kArrivals = 3 };


Status BadOption(const std::string& field, const std::string& value, const std::string& why) {
  return InvalidArgumentError("workload option " + field + " = " + value + ": " + why);
}

// A corpus must be text: UTF-8 without NUL bytes (a binary file would "encode" to byte tokens
// and run as if it were prompts).
Status CheckIsText(const std::string& path, const std::string& text) {
  const auto* b = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = b[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = c != 0 && len != 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) ok = (b[i + k] & 0xC0) == 0x80;
    if (!ok) {
      char where[64];
      std::snprintf(where, sizeof(where), "byte 0x%02x at offset %zu", c, i);
      return DataLossError("corpus " + path + " is not UTF-8 text (" + where + ")");
    }
    i += len;
  }
  return Status::Ok();
}

std::string Str(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

// Lengths drawn from a distribution (sharegpt_like, longbench_like).
bool IsSynthetic(const WorkloadOptions& o) {
  return o.kind == "sharegpt_like" || o.kind == "longbench_like";
}
bool IsTask(const WorkloadOptions& o) { return o.kind == "task"; }
bool IsPerplexity(const WorkloadOptions& o) { return o.kind == "perplexity"; }

struct Lengths {
  int64_t input = 0;
  int64_t output = 0;
};

// Scales input and output down proportionally so they sum to max_total (if they exceed it),
// keeping both at least 1. REQUIRES: max_total == 0 or >= 2.
Lengths ClampToTotal(Lengths l, int64_t max_total) {
  if (max_total == 0 || l.input + l.output <= max_total) return l;
  // long double: input * max_total can exceed 2^53 only for absurd inputs, but be exact anyway.
  const auto scaled = static_cast<int64_t>(static_cast<long double>(l.input) * max_total /
                                           static_cast<long double>(l.input + l.output));
  l.input = std::clamp<int64_t>(scaled, 1, max_total - 1);
  l.output = max_total - l.input;
  return l;
}

std::vector<Lengths> SampleLengths(const WorkloadOptions& o) {
  Rng rng(o.seed, static_cast<uint64_t>(Stream::kLengths));
  const double sigma = o.length_sigma;
  // Lognormal mean is exp(mu + sigma^2 / 2); solve for mu so the documented mean holds.
  const double mu_in = std::log(o.input_mean) - 0.5 * sigma * sigma;
  const double mu_out = std::log(o.output_mean) - 0.5 * sigma * sigma;
  auto lognormal = [&](double mu) {
    return std::max<int64_t>(1, std::llround(std::exp(mu + sigma * rng.Normal())));
  };
  std::vector<Lengths> out(static_cast<size_t>(o.num_requests));
  for (Lengths& l : out) {
    if (o.kind == "sharegpt_like") {
      l.input = lognormal(mu_in);
      l.output = lognormal(mu_out);
    } else {
      l.input = rng.UniformInt(o.input_min, o.input_max);
      l.output = rng.UniformInt(o.output_min, o.output_max);
    }
    l = ClampToTotal(l, o.max_total_tokens);
  }
  return out;
}

void AssignArrivals(const WorkloadOptions& o, std::vector<Request>& requests) {
  Rng rng(o.seed, static_cast<uint64_t>(Stream::kArrivals));
  const double mean_gap = 1.0 / o.rate;
  const double shape = 1.0 / (o.gamma_cv * o.gamma_cv);
  double t = 0.0;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (i > 0 && o.arrival == "poisson") t += rng.Exponential(mean_gap);
    if (i > 0 && o.arrival == "gamma") t += rng.Gamma(shape, mean_gap / shape);
    requests[i].arrival_s = t;
  }
}

// Draws prompt token ids: random ids, or corpus text through the tokenizer.
class PromptSource {
 public:
  virtual ~PromptSource() = default;
  // Returns exactly `n` tokens.
  virtual StatusOr<std::vector<int32_t>> Draw(Rng& rng, int64_t n) = 0;
};

class RandomIds : public PromptSource {
 public:
  explicit RandomIds(int64_t vocab_size) : vocab_size_(vocab_size) {}
  StatusOr<std::vector<int32_t>> Draw(Rng& rng, int64_t n) override {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int32_t& id : ids) id = static_cast<int32_t>(rng.UniformInt(0, vocab_size_ - 1));
    return ids;
  }

 private:
  int64_t vocab_size_;
};

class CorpusText : public PromptSource {
 public:
  static StatusOr<std::unique_ptr<CorpusText>> Load(const std::string& path,
                                                    const model::Tokenizer& tokenizer) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return NotFoundError("corpus " + path + ": cannot be read");
    std::ostringstream buf;
    buf << in.rdbuf();
    auto corpus = std::unique_ptr<CorpusText>(new CorpusText(path, buf.str(), tokenizer));
    const std::string& text = corpus->text_;
    for (size_t start = 0; start < text.size();) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      if (text.find_first_not_of(" \t\r", start) < end) corpus->line_starts_.push_back(start);
      start = end + 1;
    }
    if (corpus->line_starts_.empty()) return DataLossError("corpus " + path + " has no text");
    VTOKEN_RETURN_IF_ERROR(CheckIsText(path, text));
    return corpus;
  }

  StatusOr<std::vector<int32_t>> Draw(Rng& rng, int64_t n) override {
    const auto line = rng.UniformInt(0, static_cast<int64_t>(line_starts_.size()) - 1);
    const size_t start = line_starts_[static_cast<size_t>(line)];
    // Twice the text that should be needed (a few bytes per token), more if that falls short.
    size_t bytes = static_cast<size_t>(n) * 8 + 64;
    const size_t give_up = static_cast<size_t>(n) * 64 + 2 * text_.size() + 64;
    while (bytes <= give_up) {
      std::vector<int32_t> ids = tokenizer_.Encode(Wrapped(start, bytes));
      // One extra token: the last one may come from a word cut off by the byte limit.
      if (static_cast<int64_t>(ids.size()) > n) {
        ids.resize(static_cast<size_t>(n));
        return ids;
      }
      bytes *= 2;
    }
    return DataLossError("corpus " + path_ + " does not encode to " + std::to_string(n) +
                         " tokens");
  }

 private:
  CorpusText(std::string path, std::string text, const model::Tokenizer& tokenizer)
      : path_(std::move(path)), text_(std::move(text)), tokenizer_(tokenizer) {}

  // `bytes` characters of the corpus from `start`, wrapping around at the end.
  std::string Wrapped(size_t start, size_t bytes) const {
    std::string out;
    out.reserve(bytes);
    size_t pos = start;
    while (out.size() < bytes) {
      const size_t take = std::min(bytes - out.size(), text_.size() - pos);
      out.append(text_, pos, take);
      pos = (pos + take) % text_.size();
    }
    return out;
  }

  std::string path_;
  std::string text_;
  const model::Tokenizer& tokenizer_;
  std::vector<size_t> line_starts_;
};

// Fills prompt_tokens (and prefix groups) of the synthetic kinds.
Status DrawPrompts(const WorkloadOptions& o, const std::vector<Lengths>& lengths,
                   PromptSource& source, std::vector<Request>& requests) {
  Rng rng(o.seed, static_cast<uint64_t>(Stream::kPrompts));
  const auto degree = static_cast<size_t>(o.prefix_sharing_degree);
  // Draws for a suffix whose first token must differ from the other members' (a corpus start
  // line may repeat); random ids need one redraw in vocab_size / degree cases on average.
  constexpr int kMaxDraws = 1000;
  for (size_t first = 0; first < requests.size(); first += degree) {
    const size_t last = std::min(first + degree, requests.size());
    int64_t shared = 0;
    std::vector<int32_t> prefix;
    if (degree > 1) {
      int64_t shortest = std::numeric_limits<int64_t>::max();
      for (size_t i = first; i < last; ++i) shortest = std::min(shortest, lengths[i].input);
      shared = static_cast<int64_t>(
          std::floor(o.shared_prefix_fraction * static_cast<double>(shortest)));
      VTOKEN_ASSIGN_OR_RETURN(prefix, source.Draw(rng, shared));
    }
    std::set<int32_t> first_tokens;  // first token after the prefix, per member so far
    for (size_t i = first; i < last; ++i) {
      Request& r = requests[i];
      std::vector<int32_t> suffix;
      for (int draw = 0;; ++draw) {
        if (draw == kMaxDraws) {
          return InvalidArgumentError("corpus " + o.corpus_path + ": found no " +
                                      std::to_string(degree) +
                                      " distinct continuations of a shared prefix");
        }
        VTOKEN_ASSIGN_OR_RETURN(suffix, source.Draw(rng, lengths[i].input - shared));
        if (degree == 1 || first_tokens.insert(suffix.front()).second) break;
      }
      r.prompt_tokens = prefix;
      r.prompt_tokens.insert(r.prompt_tokens.end(), suffix.begin(), suffix.end());
      if (degree > 1) {
        r.prefix_group = static_cast<int32_t>(first / degree);
        r.shared_prefix_tokens = shared;
      }
    }
  }
  return Status::Ok();
}

// One request from a JSON object of any jsonl format (workload.h); `where` prefixes errors.
StatusOr<Request> ParseRequestObject(const Json& obj, const std::string& where,
                                     const WorkloadOptions& o, const model::Tokenizer& tokenizer) {
  if (!obj.is_object()) return DataLossError(where + "expected a JSON object");
  Request r;
  std::optional<int64_t> max_tokens;
  if (obj.contains("conversations")) {
    const Json& turns = obj["conversations"];
    if (!turns.is_array()) return DataLossError(where + "\"conversations\" is not an array");
    for (const Json& turn : turns) {
      if (!turn.is_object() || !turn.contains("from") || !turn["from"].is_string() ||
          !turn.contains("value") || !turn["value"].is_string()) {
        return DataLossError(where + "each conversation turn needs string \"from\" and \"value\"");
      }
    }
    auto from_is = [&](size_t i, std::initializer_list<std::string_view> names) {
      const std::string& from = turns[i]["from"].get_ref<const std::string&>();
      return std::find(names.begin(), names.end(), from) != names.end();
    };
    size_t human = 0;
    while (human < turns.size() && !from_is(human, {"human", "user"})) ++human;
    if (human == turns.size()) return DataLossError(where + "conversation has no human turn");
    r.prompt = turns[human]["value"].get<std::string>();
    if (human + 1 < turns.size() && from_is(human + 1, {"gpt", "assistant", "chatgpt"})) {
      r.reference = turns[human + 1]["value"].get<std::string>();
      max_tokens =
          std::max<int64_t>(1, static_cast<int64_t>(tokenizer.Encode(*r.reference).size()));
    }
  } else if (!obj.contains("prompt") && (obj.contains("context") || obj.contains("input"))) {
    for (const char* key : {"context", "input"}) {
      if (!obj.contains(key) || !obj[key].is_string()) {
        return DataLossError(where + "a LongBench line needs string \"context\" and \"input\"");
      }
    }
    r.prompt = o.prompt_template;
    for (const char* key : {"context", "input"}) {
      const std::string field = std::string("{") + key + "}";
      const size_t at = r.prompt.find(field);
      if (at != std::string::npos) r.prompt.replace(at, field.size(), obj[key].get<std::string>());
    }
    if (obj.contains("answers") && !obj["answers"].is_null()) {
      const Json& answers = obj["answers"];
      if (!answers.is_array() || (!answers.empty() && !answers[0].is_string())) {
        return DataLossError(where + "\"answers\" must be an array of strings");
      }
      if (!answers.empty()) r.reference = answers[0].get<std::string>();
    }
  } else {
    if (!obj.contains("prompt") || !obj["prompt"].is_string()) {
      return DataLossError(where +
                           "needs a string \"prompt\" (or ShareGPT \"conversations\", or "
                           "LongBench \"context\" and \"input\")");
    }
    r.prompt = obj["prompt"].get<std::string>();
    if (obj.contains("reference") && !obj["reference"].is_null()) {
      if (!obj["reference"].is_string()) return DataLossError(where + "\"reference\" must be a string");
      r.reference = obj["reference"].get<std::string>();
    }
  }
  if (obj.contains("max_tokens")) {
    const Json& m = obj["max_tokens"];
    // Unsigned first: 2^63 and above would wrap to a negative int64_t.
    const bool in_range =
        m.is_number_unsigned()
            ? m.get<uint64_t>() >= 1 && m.get<uint64_t>() <= uint64_t{kMaxRequestTokens}
            : m.is_number_integer() && m.get<int64_t>() >= 1 &&
                  m.get<int64_t>() <= kMaxRequestTokens;
    if (!in_range) {
      return DataLossError(where + "\"max_tokens\" must be an integer in [1, " +
                           std::to_string(kMaxRequestTokens) + "]");
    }
    max_tokens = m.get<int64_t>();
  }
  r.prompt_tokens = tokenizer.Encode(r.prompt);
  if (r.prompt_tokens.empty()) return DataLossError(where + "the prompt encodes to no tokens");
  r.max_tokens = max_tokens.value_or(o.jsonl_default_max_tokens);
  return r;
}

// Reads the jsonl kind's requests; lengths are clamped after (workload.truncate).
StatusOr<std::vector<Request>> ReadJsonl(const WorkloadOptions& o,
                                         const model::Tokenizer& tokenizer) {
  std::ifstream in(o.jsonl_path);
  if (!in) return NotFoundError("workload " + o.jsonl_path + ": cannot be read");
  std::vector<Request> requests;
  auto full = [&] {
    return o.num_requests > 0 && static_cast<int64_t>(requests.size()) == o.num_requests;
  };
  // A file whose first non-blank character is '[' is one JSON array (ShareGPT's .json files).
  char first = 0;
  while (in.get(first) && std::isspace(static_cast<unsigned char>(first))) {
  }
  if (in && first == '[') {
    in.unget();
    const Json all = Json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (all.is_discarded() || !all.is_array()) {
      return DataLossError(o.jsonl_path + ": not a valid JSON array");
    }
    for (size_t i = 0; i < all.size() && !full(); ++i) {
      const std::string where = o.jsonl_path + ": element " + std::to_string(i) + ": ";
      VTOKEN_ASSIGN_OR_RETURN(Request r, ParseRequestObject(all[i], where, o, tokenizer));
      r.id = static_cast<int64_t>(requests.size());
      requests.push_back(std::move(r));
    }
  } else {
    in.clear();
    in.seekg(0);
    std::string line;
    for (int64_t line_no = 1; !full() && std::getline(in, line); ++line_no) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = o.jsonl_path + ":" + std::to_string(line_no) + ": ";
      const Json obj = Json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (obj.is_discarded()) return DataLossError(where + "not valid JSON");
      VTOKEN_ASSIGN_OR_RETURN(Request r, ParseRequestObject(obj, where, o, tokenizer));
      r.id = static_cast<int64_t>(requests.size());
      requests.push_back(std::move(r));
    }
    if (in.bad()) return DataLossError("workload " + o.jsonl_path + ": read error");
  }
  if (requests.empty()) return DataLossError("workload " + o.jsonl_path + " holds no requests");
  for (Request& r : requests) {
    const int64_t n = static_cast<int64_t>(r.prompt_tokens.size());
    const Lengths l = ClampToTotal({n, r.max_tokens}, o.max_total_tokens);
    if (l.input < n) {
      r.truncated_from = n;
      if (o.truncate == "middle") {  // The first and the last halves, as LongBench cuts.
        const int64_t head = l.input / 2, tail = l.input - head;
        std::vector<int32_t> kept(r.prompt_tokens.begin(), r.prompt_tokens.begin() + head);
        kept.insert(kept.end(), r.prompt_tokens.end() - tail, r.prompt_tokens.end());
        r.prompt_tokens = std::move(kept);
      } else {
        r.prompt_tokens.resize(static_cast<size_t>(l.input));
      }
      r.prompt = tokenizer.Decode(r.prompt_tokens);
    }
    r.max_tokens = l.output;
  }
  return requests;
}

TaskOptions TaskOptionsOf(const WorkloadOptions& o) {
  return {.task = o.task,
          .context_tokens = o.context_tokens,
          .filler = o.filler,
          .corpus_path = o.corpus_path};
}

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
    r.max_tokens = t.max_tokens;
    r.prompt_tokens = before;
    r.prompt_tokens.insert(r.prompt_tokens.end(), t.context_ids.begin(), t.context_ids.end());
    std::vector<int32_t>& question =
        o.protocol == TaskProtocol::kQueryAgnostic ? r.question_tokens : r.prompt_tokens;
    question.insert(question.end(), t.question_ids.begin(), t.question_ids.end());
    question.insert(question.end(), after.begin(), after.end());
    r.prompt = (o.chat ? o.chat_prefix : "") + t.context + t.question +
               (o.chat ? o.chat_suffix : "");
    const int64_t total = static_cast<int64_t>(r.prompt_tokens.size() + r.question_tokens.size()) +
                          r.max_tokens;
    if (o.max_total_tokens > 0 && total > o.max_total_tokens) {
      return BadOption("context_tokens", std::to_string(o.context_tokens),
                       "request " + std::to_string(i) + " needs " + std::to_string(total) +
                           " tokens with the chat template and its answer, more than "
                           "max_total_tokens = " + std::to_string(o.max_total_tokens));
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

// kind perplexity: a segment of context_tokens corpus tokens per request, from a random line;
// the first token is the prompt, the others are forced.
StatusOr<std::vector<Request>> PerplexityRequests(const WorkloadOptions& o,
                                                  const model::Tokenizer& tokenizer) {
  if (o.corpus_path.empty()) {
    return BadOption("corpus", "\"\"", "required by kind perplexity (the text scored)");
  }
  if (o.max_total_tokens > 0 && o.context_tokens > o.max_total_tokens) {
    return BadOption("context_tokens", std::to_string(o.context_tokens),
                     "more than max_total_tokens = " + std::to_string(o.max_total_tokens));
  }
  VTOKEN_ASSIGN_OR_RETURN(std::unique_ptr<PromptSource> source,
                          CorpusText::Load(o.corpus_path, tokenizer));
  Rng rng(o.seed, static_cast<uint64_t>(Stream::kPrompts));
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

}  // namespace

Status ValidateWorkloadOptions(const WorkloadOptions& o) {
  if (!IsSynthetic(o) && !IsTask(o) && !IsPerplexity(o) && o.kind != "jsonl") {
    return BadOption("kind", o.kind,
                     "expected sharegpt_like, longbench_like, jsonl, task or perplexity");
  }
  if (IsPerplexity(o)) {
    if (o.context_tokens < 2 || o.context_tokens > kMaxRequestTokens) {
      return BadOption("context_tokens", std::to_string(o.context_tokens),
                       "must be in [2, " + std::to_string(kMaxRequestTokens) + "] for kind "
                       "perplexity (one prompt token, the rest scored)");
    }
    if (o.chat) return BadOption("chat", "true", "does not apply to kind perplexity");
    if (o.prefix_sharing_degree != 1) {
      return BadOption("prefix_sharing_degree", std::to_string(o.prefix_sharing_degree),
                       "must be 1 for kind perplexity");
    }
  }
  if (o.truncate != "end" && o.truncate != "middle") {
    return BadOption("truncate", o.truncate, "expected end or middle");
  }
  const int64_t min_requests = o.kind == "jsonl" ? 0 : 1;
  if (o.num_requests < min_requests) {
    return BadOption("num_requests", std::to_string(o.num_requests),
                     "must be >= " + std::to_string(min_requests));
  }
  // Bounds first, so that no sum or product below can overflow.
  const std::pair<const char*, int64_t> counts[] = {
      {"num_requests", o.num_requests},       {"input_min", o.input_min},
      {"input_max", o.input_max},             {"output_min", o.output_min},
      {"output_max", o.output_max},           {"max_total_tokens", o.max_total_tokens},
      {"jsonl_default_max_tokens", o.jsonl_default_max_tokens}};
  for (const auto& [field, value] : counts) {
    if (value > kMaxRequestTokens) {
      return BadOption(field, std::to_string(value),
                       "must be <= " + std::to_string(kMaxRequestTokens));
    }
  }
  if (!(o.input_mean <= kMaxRequestTokens)) {
    return BadOption("input_mean", Str(o.input_mean),
                     "must be <= " + std::to_string(kMaxRequestTokens));
  }
  if (!(o.output_mean <= kMaxRequestTokens)) {
    return BadOption("output_mean", Str(o.output_mean),
                     "must be <= " + std::to_string(kMaxRequestTokens));
  }
  if (!(std::isfinite(o.input_mean) && o.input_mean > 0)) {
    return BadOption("input_mean", Str(o.input_mean), "must be > 0");
  }
  if (!(std::isfinite(o.output_mean) && o.output_mean > 0)) {
    return BadOption("output_mean", Str(o.output_mean), "must be > 0");
  }
  if (!(std::isfinite(o.length_sigma) && o.length_sigma >= 0 && o.length_sigma <= 10)) {
    return BadOption("length_sigma", Str(o.length_sigma), "must be in [0, 10]");
  }
  if (o.input_min < 1) return BadOption("input_min", std::to_string(o.input_min), "must be >= 1");
  if (o.input_max < o.input_min) {
    return BadOption("input_max", std::to_string(o.input_max), "must be >= input_min");
  }
  if (o.output_min < 1) {
    return BadOption("output_min", std::to_string(o.output_min), "must be >= 1");
  }
  if (o.output_max < o.output_min) {
    return BadOption("output_max", std::to_string(o.output_max), "must be >= output_min");
  }
  if (o.max_total_tokens != 0 && o.max_total_tokens < 2) {
    return BadOption("max_total_tokens", std::to_string(o.max_total_tokens),
                     "must be 0 (no limit) or >= 2");
  }
  if (o.arrival != "all" && o.arrival != "poisson" && o.arrival != "gamma") {
    return BadOption("arrival", o.arrival, "expected all, poisson or gamma");
  }
  if (o.arrival != "all" && !(std::isfinite(o.rate) && o.rate > 0)) {
    return BadOption("rate", Str(o.rate), "must be > 0 requests/s");
  }
  if (o.arrival == "gamma" && !(std::isfinite(o.gamma_cv) && o.gamma_cv > 0)) {
    return BadOption("gamma_cv", Str(o.gamma_cv), "must be > 0");
  }
  if (o.prefix_sharing_degree < 1) {
    return BadOption("prefix_sharing_degree", std::to_string(o.prefix_sharing_degree),
                     "must be >= 1");
  }
  const int32_t d = o.prefix_sharing_degree;
  if (d != 1 && d != 2 && d != 4 && d != 8) {
    return BadOption("prefix_sharing_degree", std::to_string(d), "must be 1, 2, 4 or 8");
  }
  if (o.kind != "jsonl" && !o.jsonl_path.empty()) {
    return BadOption("jsonl", o.jsonl_path, "is read only by kind jsonl (kind is " + o.kind + ")");
  }
  if (o.kind != "jsonl" && o.truncate != WorkloadOptions{}.truncate) {
    return BadOption("truncate", o.truncate, "is read only by kind jsonl (kind is " + o.kind + ")");
  }
  if (!(o.shared_prefix_fraction >= 0 && o.shared_prefix_fraction < 1)) {
    return BadOption("shared_prefix_fraction", Str(o.shared_prefix_fraction), "must be in [0, 1)");
  }
  if (!IsTask(o) && o.protocol != TaskProtocol::kQuestionAware) {
    return BadOption("protocol", TaskProtocolName(o.protocol),
                     "is read only by kind task (kind is " + o.kind + ")");
  }
  if (IsTask(o)) {
    VTOKEN_RETURN_IF_ERROR(ValidateTaskOptions(TaskOptionsOf(o)));
    if (o.depths.empty()) return BadOption("depths", "[]", "needs at least one depth");
    for (double d : o.depths) {
      if (!(d >= 0.0 && d <= 1.0)) return BadOption("depths", Str(d), "must be in [0, 1]");
    }
    if (o.prefix_sharing_degree != 1) {
      return BadOption("prefix_sharing_degree", std::to_string(o.prefix_sharing_degree),
                       "must be 1 for kind task");
    }
  }
  if (o.kind == "jsonl") {
    if (o.jsonl_path.empty()) return BadOption("jsonl_path", "\"\"", "required by kind jsonl");
    if (o.prefix_sharing_degree != 1) {
      return BadOption("prefix_sharing_degree", std::to_string(o.prefix_sharing_degree),
                       "must be 1 for kind jsonl (its prompts are given)");
    }
    if (o.jsonl_default_max_tokens < 1) {
      return BadOption("jsonl_default_max_tokens", std::to_string(o.jsonl_default_max_tokens),
                       "must be >= 1");
    }
  }
  return Status::Ok();
}

int64_t WorkloadBytes(const WorkloadOptions& o) {
  // Per request: the Request and its result, prompt ids and text (about 4 bytes a token each),
  // output ids and text, and one step record per output token (the engine's step count is at
  // least the longest output; every token as a step bounds it).
  constexpr int64_t kPerRequest = 512, kPerPromptToken = 8, kPerOutputToken = 8 + 120;
  int64_t input = 0, output = 0, requests = o.num_requests;
  if (o.kind == "jsonl") {
    std::error_code ec;
    const auto size = std::filesystem::file_size(o.jsonl_path, ec);
    const int64_t bytes = ec ? 0 : static_cast<int64_t>(std::min<uintmax_t>(size, INT64_MAX / 16));
    // A prompt has at most one token per byte; every line could be a request.
    return SaturatingMul(bytes, 16);
  }
  if (IsTask(o)) {
    input = o.context_tokens + 64;  // the chat template around it
    output = 128;
  } else if (IsPerplexity(o)) {
    input = 1;
    output = o.context_tokens;
  } else if (o.kind == "longbench_like") {
    input = o.input_max;
    output = o.output_max;
  } else {
    input = static_cast<int64_t>(o.input_mean) + 1;
    output = static_cast<int64_t>(o.output_mean) + 1;
  }
  if (o.max_total_tokens > 0) {
    input = std::min(input, o.max_total_tokens);
    output = std::min(output, o.max_total_tokens);
  }
  const int64_t per = SaturatingAdd(kPerRequest, SaturatingAdd(SaturatingMul(input, kPerPromptToken),
                                                               SaturatingMul(output, kPerOutputToken)));
  return SaturatingMul(requests, per);
}

StatusOr<std::vector<Request>> GenerateWorkload(const WorkloadOptions& options,
                                                const model::Tokenizer* tokenizer,
                                                int64_t vocab_size) {
  VTOKEN_RETURN_IF_ERROR(ValidateWorkloadOptions(options));
  std::vector<Request> requests;
  if (IsTask(options)) {
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
  if (IsPerplexity(options)) {
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
        return BadOption("corpus_path", "\"\"", "required to draw prompts for a real tokenizer");
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
