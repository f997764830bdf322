#include "lib/engine/workload_options.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <utility>

#include "lib/core/memory_budget.h"

namespace vtoken::engine {
namespace {

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

}  // namespace

Status WorkloadOptionError(const std::string& field, const std::string& value,
                           const std::string& why) {
  return InvalidArgumentError("workload option " + field + " = " + value + ": " + why);
}

std::string WorkloadOptionField(const Status& status) {
  const std::string prefix = "workload option ";
  const std::string& m = status.message();
  if (status.code() != StatusCode::kInvalidArgument || m.rfind(prefix, 0) != 0) return "";
  const size_t end = m.find(" = ", prefix.size());
  return end == std::string::npos ? "" : m.substr(prefix.size(), end - prefix.size());
}

TaskOptions TaskOptionsOf(const WorkloadOptions& o) {
  return {.task = o.task,
          .context_tokens = o.context_tokens,
          .filler = o.filler,
          .corpus_path = o.corpus_path};
}

Status ValidateWorkloadOptions(const WorkloadOptions& o) {
  if (!IsSynthetic(o) && !IsTask(o) && !IsPerplexity(o) && o.kind != "jsonl") {
    return WorkloadOptionError("kind", o.kind,
                               "expected sharegpt_like, longbench_like, jsonl, task or perplexity");
  }
  if (IsPerplexity(o)) {
    if (o.context_tokens < 2 || o.context_tokens > kMaxRequestTokens) {
      return WorkloadOptionError("context_tokens", std::to_string(o.context_tokens),
                                 "must be in [2, " + std::to_string(kMaxRequestTokens) +
                                     "] for kind "
                                     "perplexity (one prompt token, the rest scored)");
    }
    if (o.chat) return WorkloadOptionError("chat", "true", "does not apply to kind perplexity");
    if (o.prefix_sharing_degree != 1) {
      return WorkloadOptionError("prefix_sharing_degree", std::to_string(o.prefix_sharing_degree),
                                 "must be 1 for kind perplexity");
    }
  }
  if (o.truncate != "end" && o.truncate != "middle") {
    return WorkloadOptionError("truncate", o.truncate, "expected end or middle");
  }
  const int64_t min_requests = o.kind == "jsonl" ? 0 : 1;
  if (o.num_requests < min_requests) {
    return WorkloadOptionError("num_requests", std::to_string(o.num_requests),
                               "must be >= " + std::to_string(min_requests));
  }
  // Bounds first, so that no sum or product below can overflow.
  const std::pair<const char*, int64_t> counts[] = {
      {"num_requests", o.num_requests},
      {"input_min", o.input_min},
      {"input_max", o.input_max},
      {"output_min", o.output_min},
      {"output_max", o.output_max},
      {"max_total_tokens", o.max_total_tokens},
      {"jsonl_default_max_tokens", o.jsonl_default_max_tokens}};
  for (const auto& [field, value] : counts) {
    if (value > kMaxRequestTokens) {
      return WorkloadOptionError(field, std::to_string(value),
                                 "must be <= " + std::to_string(kMaxRequestTokens));
    }
  }
  if (!(o.input_mean <= kMaxRequestTokens)) {
    return WorkloadOptionError("input_mean", Str(o.input_mean),
                               "must be <= " + std::to_string(kMaxRequestTokens));
  }
  if (!(o.output_mean <= kMaxRequestTokens)) {
    return WorkloadOptionError("output_mean", Str(o.output_mean),
                               "must be <= " + std::to_string(kMaxRequestTokens));
  }
  if (!(std::isfinite(o.input_mean) && o.input_mean > 0)) {
    return WorkloadOptionError("input_mean", Str(o.input_mean), "must be > 0");
  }
  if (!(std::isfinite(o.output_mean) && o.output_mean > 0)) {
    return WorkloadOptionError("output_mean", Str(o.output_mean), "must be > 0");
  }
  if (!(std::isfinite(o.length_sigma) && o.length_sigma >= 0 && o.length_sigma <= 10)) {
    return WorkloadOptionError("length_sigma", Str(o.length_sigma), "must be in [0, 10]");
  }
  if (o.input_min < 1)
    return WorkloadOptionError("input_min", std::to_string(o.input_min), "must be >= 1");
  if (o.input_max < o.input_min) {
    return WorkloadOptionError("input_max", std::to_string(o.input_max), "must be >= input_min");
  }
  if (o.output_min < 1) {
    return WorkloadOptionError("output_min", std::to_string(o.output_min), "must be >= 1");
  }
  if (o.output_max < o.output_min) {
    return WorkloadOptionError("output_max", std::to_string(o.output_max), "must be >= output_min");
  }
  if (o.max_total_tokens != 0 && o.max_total_tokens < 2) {
    return WorkloadOptionError("max_total_tokens", std::to_string(o.max_total_tokens),
                               "must be 0 (no limit) or >= 2");
  }
  if (o.arrival != "all" && o.arrival != "poisson" && o.arrival != "gamma") {
    return WorkloadOptionError("arrival", o.arrival, "expected all, poisson or gamma");
  }
  if (o.arrival != "all" && !(std::isfinite(o.rate) && o.rate > 0)) {
    return WorkloadOptionError("rate", Str(o.rate), "must be > 0 requests/s");
  }
  if (o.arrival == "gamma" && !(std::isfinite(o.gamma_cv) && o.gamma_cv > 0)) {
    return WorkloadOptionError("gamma_cv", Str(o.gamma_cv), "must be > 0");
  }
  if (o.prefix_sharing_degree < 1) {
    return WorkloadOptionError("prefix_sharing_degree", std::to_string(o.prefix_sharing_degree),
                               "must be >= 1");
  }
  const int32_t d = o.prefix_sharing_degree;
  if (d != 1 && d != 2 && d != 4 && d != 8) {
    return WorkloadOptionError("prefix_sharing_degree", std::to_string(d), "must be 1, 2, 4 or 8");
  }
  if (o.kind != "jsonl" && !o.jsonl_path.empty()) {
    return WorkloadOptionError("jsonl", o.jsonl_path,
                               "is read only by kind jsonl (kind is " + o.kind + ")");
  }
  if (o.kind != "jsonl" && o.truncate != WorkloadOptions{}.truncate) {
    return WorkloadOptionError("truncate", o.truncate,
                               "is read only by kind jsonl (kind is " + o.kind + ")");
  }
  if (!(o.shared_prefix_fraction >= 0 && o.shared_prefix_fraction < 1)) {
    return WorkloadOptionError("shared_prefix_fraction", Str(o.shared_prefix_fraction),
                               "must be in [0, 1)");
  }
  if (!IsTask(o) && o.protocol != TaskProtocol::kQuestionAware) {
    return WorkloadOptionError("protocol", TaskProtocolName(o.protocol),
                               "is read only by kind task (kind is " + o.kind + ")");
  }
  if (IsTask(o)) {
    VTOKEN_RETURN_IF_ERROR(ValidateTaskOptions(TaskOptionsOf(o)));
    if (o.depths.empty()) return WorkloadOptionError("depths", "[]", "needs at least one depth");
    for (double d : o.depths) {
      if (!(d >= 0.0 && d <= 1.0))
        return WorkloadOptionError("depths", Str(d), "must be in [0, 1]");
    }
    if (o.prefix_sharing_degree != 1) {
      return WorkloadOptionError("prefix_sharing_degree", std::to_string(o.prefix_sharing_degree),
                                 "must be 1 for kind task");
    }
  }
  if (o.kind == "jsonl") {
    if (o.jsonl_path.empty())
      return WorkloadOptionError("jsonl_path", "\"\"", "required by kind jsonl");
    if (o.prefix_sharing_degree != 1) {
      return WorkloadOptionError("prefix_sharing_degree", std::to_string(o.prefix_sharing_degree),
                                 "must be 1 for kind jsonl (its prompts are given)");
    }
    if (o.jsonl_default_max_tokens < 1) {
      return WorkloadOptionError("jsonl_default_max_tokens",
                                 std::to_string(o.jsonl_default_max_tokens), "must be >= 1");
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
    output = std::max<int64_t>(128, o.answer_tokens);
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
  const int64_t per = SaturatingAdd(
      kPerRequest,
      SaturatingAdd(SaturatingMul(input, kPerPromptToken), SaturatingMul(output, kPerOutputToken)));
  return SaturatingMul(requests, per);
}

}  // namespace vtoken::engine
