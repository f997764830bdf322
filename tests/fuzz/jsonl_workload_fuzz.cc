// libFuzzer target: JSONL workloads. Reading must return an error naming the file, or requests
// whose prompts are non-empty, in the vocabulary and whose lengths are in range (and within
// max_total_tokens when set).
#include <cstddef>
#include <cstdint>
#include <string>

#include "lib/engine/workload.h"
#include "tests/fuzz/fuzz_file.h"

namespace {

// A byte-level tokenizer: 256 single-byte tokens, no merges, <|end_of_text|> added.
const vtoken::model::Tokenizer& ByteTokenizer() {
  static const vtoken::model::Tokenizer tok = [] {
    vtoken::model::TokenizerSpec spec;
    for (int b = 0; b < 256; ++b) {
      spec.vocab.emplace_back(vtoken::model::ByteLevelEncode(std::string(1, static_cast<char>(b))),
                              b);
    }
    spec.added_tokens.push_back({256, "<|end_of_text|>", true});
    return std::move(vtoken::model::Tokenizer::Create(std::move(spec)).value());
  }();
  return tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vtoken;
  if (size < 1) return 0;
  engine::WorkloadOptions o;
  o.kind = "jsonl";
  o.num_requests = data[0] % 4 == 0 ? 0 : data[0] % 16;
  o.max_total_tokens = data[0] & 0x80 ? 0 : 2 + data[0] % 64;
  o.jsonl_path = fuzz::WriteInput(data + 1, size - 1, ".jsonl");
  StatusOr<std::vector<engine::Request>> r = engine::GenerateWorkload(o, &ByteTokenizer(), 257);
  if (!r.ok()) {
    if (r.status().message().find(o.jsonl_path) == std::string::npos) {
      fuzz::Fail("error does not name the file: " + r.status().message());
    }
    return 0;
  }
  if (r->empty()) fuzz::Fail("no requests and no error");
  if (o.num_requests > 0 && static_cast<int64_t>(r->size()) > o.num_requests) {
    fuzz::Fail("more requests than num_requests");
  }
  for (const engine::Request& q : *r) {
    const auto n = static_cast<int64_t>(q.prompt_tokens.size());
    if (n < 1 || q.max_tokens < 1 || q.max_tokens > engine::kMaxRequestTokens) {
      fuzz::Fail("request lengths out of range");
    }
    if (o.max_total_tokens > 0 && n + q.max_tokens > o.max_total_tokens) {
      fuzz::Fail("request exceeds max_total_tokens");
    }
    for (int32_t id : q.prompt_tokens) {
      if (id < 0 || id >= 257) fuzz::Fail("prompt id outside the vocabulary");
    }
  }
  return 0;
}
