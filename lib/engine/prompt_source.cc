#include "lib/engine/prompt_source.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <utility>

namespace vtoken::engine {
namespace {

// A corpus must be text: UTF-8 without NUL bytes (a binary file would "encode" to byte tokens
// and run as if it were prompts).
Status CheckIsText(const std::string& path, const std::string& text) {
  const auto* b = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = b[i];
    size_t len = c < 0x80           ? 1
                 : (c >> 5) == 0x6  ? 2
                 : (c >> 4) == 0xE  ? 3
                 : (c >> 3) == 0x1E ? 4
                                    : 0;
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

}  // namespace

StatusOr<std::vector<int32_t>> RandomIds::Draw(Rng& rng, int64_t n) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = static_cast<int32_t>(rng.UniformInt(0, vocab_size_ - 1));
  return ids;
}

StatusOr<std::unique_ptr<CorpusText>> CorpusText::Load(const std::string& path,
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

StatusOr<std::vector<int32_t>> CorpusText::Draw(Rng& rng, int64_t n) {
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
  return DataLossError("corpus " + path_ + " does not encode to " + std::to_string(n) + " tokens");
}

std::string CorpusText::Wrapped(size_t start, size_t bytes) const {
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

Status DrawPrompts(const WorkloadOptions& o, const std::vector<Lengths>& lengths,
                   PromptSource& source, std::vector<Request>& requests) {
  Rng rng(o.seed, static_cast<uint64_t>(WorkloadStream::kPrompts));
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

}  // namespace vtoken::engine
