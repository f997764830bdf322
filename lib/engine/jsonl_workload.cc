#include "lib/engine/jsonl_workload.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "lib/engine/request_lengths.h"

namespace vtoken::engine {
namespace {

using Json = nlohmann::json;

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
      if (!obj["reference"].is_string())
        return DataLossError(where + "\"reference\" must be a string");
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

}  // namespace

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

}  // namespace vtoken::engine
