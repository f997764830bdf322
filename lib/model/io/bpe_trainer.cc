#include "lib/model/io/bpe_trainer.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <set>
#include <unordered_map>

#include "lib/model/io/pretokenizer.h"

namespace vtoken::model {
namespace {

using Pair = std::pair<int32_t, int32_t>;

struct PairHash {
  size_t operator()(const Pair& p) const {
    return std::hash<uint64_t>{}((static_cast<uint64_t>(p.first) << 32) |
                                 static_cast<uint32_t>(p.second));
  }
};

struct Word {
  std::vector<int32_t> symbols;
  int64_t freq = 0;
};

// Heap entry; the count may be stale (higher than the true count) and is checked when popped.
struct Candidate {
  int64_t count;
  Pair pair;
  bool operator<(const Candidate& o) const {
    return count != o.count ? count < o.count : pair > o.pair;  // Max count, then smallest ids.
  }
};

bool IsValidUtf8(std::string_view s) {
  while (!s.empty()) {
    auto [c, len] = DecodeUtf8(s);
    if (c == 0xFFFD && s.substr(0, len) != "\xEF\xBF\xBD") return false;
    s.remove_prefix(len);
  }
  return true;
}

// Counts the pre-tokens of `corpus`, skipping occurrences of the special tokens.
std::vector<Word> CountWords(std::string_view corpus, const std::vector<std::string>& specials) {
  std::unordered_map<std::string_view, int64_t> counts;
  auto count_segment = [&](std::string_view segment) {
    for (std::string_view piece : PreTokenize(SplitPattern::kLlama3, segment)) ++counts[piece];
  };
  // next[k]: where special k next occurs at or after `pos` (npos if never), found once per hop.
  std::vector<size_t> next;
  for (const std::string& s : specials) next.push_back(corpus.find(s));
  size_t pos = 0;
  while (pos < corpus.size()) {
    size_t first = std::string_view::npos;
    size_t length = 0;
    for (size_t k = 0; k < specials.size(); ++k) {
      if (next[k] != std::string_view::npos && next[k] < pos) {
        next[k] = corpus.find(specials[k], pos);
      }
      if (next[k] < first || (next[k] == first && specials[k].size() > length)) {
        first = next[k];
        length = specials[k].size();
      }
    }
    count_segment(corpus.substr(pos, std::min(first, corpus.size()) - pos));
    pos = first == std::string_view::npos ? corpus.size() : first + length;
  }
  // Sorted so that word indices, and with them tie-breaking, do not depend on hash order.
  std::vector<std::pair<std::string_view, int64_t>> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end());
  std::vector<Word> words;
  words.reserve(sorted.size());
  for (const auto& [text, freq] : sorted) {
    Word w;
    w.freq = freq;
    for (char ch : text) w.symbols.push_back(static_cast<uint8_t>(ch));
    words.push_back(std::move(w));
  }
  return words;
}

}  // namespace

StatusOr<Tokenizer> TrainByteLevelBpe(std::string_view corpus, int vocab_size,
                                      std::vector<std::string> special_tokens) {
  const int num_specials = static_cast<int>(special_tokens.size());
  if (vocab_size < 256 + num_specials) {
    return InvalidArgumentError("vocab size " + std::to_string(vocab_size) +
                                " is below 256 byte tokens + " + std::to_string(num_specials) +
                                " special tokens");
  }
  std::set<std::string_view> seen;
  for (const std::string& s : special_tokens) {
    if (s.empty() || !IsValidUtf8(s) || !seen.insert(s).second) {
      return InvalidArgumentError("special token '" + s + "' is empty, repeated or not UTF-8");
    }
  }

  std::vector<Word> words = CountWords(corpus, special_tokens);
  std::vector<std::string> id_to_token;
  std::unordered_map<std::string, int32_t> token_to_id;
  for (int b = 0; b < 256; ++b) {
    id_to_token.push_back(ByteToUnicode(static_cast<uint8_t>(b)));
    token_to_id.emplace(id_to_token.back(), b);
  }

  std::unordered_map<Pair, int64_t, PairHash> pair_count;
  std::unordered_map<Pair, std::vector<int32_t>, PairHash> pair_words;
  for (int32_t w = 0; w < static_cast<int32_t>(words.size()); ++w) {
    const auto& sym = words[w].symbols;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      Pair p{sym[i], sym[i + 1]};
      pair_count[p] += words[w].freq;
      pair_words[p].push_back(w);
    }
  }
  std::priority_queue<Candidate> heap;
  for (const auto& [p, c] : pair_count) heap.push({c, p});

  std::vector<std::pair<std::string, std::string>> merges;
  const size_t target = static_cast<size_t>(vocab_size - num_specials);
  std::unordered_map<Pair, int64_t, PairHash> delta;
  while (id_to_token.size() < target && !heap.empty()) {
    Candidate top = heap.top();
    heap.pop();
    int64_t current = pair_count[top.pair];
    if (current != top.count) {
      if (current > 0) heap.push({current, top.pair});
      continue;
    }
    if (current <= 0) continue;

    auto [a, b] = top.pair;
    std::string merged = id_to_token[a] + id_to_token[b];
    merges.emplace_back(id_to_token[a], id_to_token[b]);
    // Two different pairs can spell the same token; it keeps its first id (as Hugging Face does).
    auto [it, is_new] = token_to_id.emplace(merged, static_cast<int32_t>(id_to_token.size()));
    if (is_new) id_to_token.push_back(merged);
    const int32_t c = it->second;

    std::vector<int32_t> affected = std::move(pair_words[top.pair]);
    pair_words.erase(top.pair);
    std::sort(affected.begin(), affected.end());
    affected.erase(std::unique(affected.begin(), affected.end()), affected.end());
    delta.clear();
    for (int32_t w : affected) {
      std::vector<int32_t>& sym = words[w].symbols;
      const int64_t freq = words[w].freq;
      std::vector<int32_t> next;
      next.reserve(sym.size());
      for (size_t i = 0; i < sym.size(); ++i) {
        if (i + 1 < sym.size() && sym[i] == a && sym[i + 1] == b) {
          next.push_back(c);
          ++i;
        } else {
          next.push_back(sym[i]);
        }
      }
      if (next.size() == sym.size()) continue;  // Listed for the pair, but merged away already.
      for (size_t i = 0; i + 1 < sym.size(); ++i) delta[{sym[i], sym[i + 1]}] -= freq;
      for (size_t i = 0; i + 1 < next.size(); ++i) {
        Pair p{next[i], next[i + 1]};
        delta[p] += freq;
        if (p.first == c || p.second == c) pair_words[p].push_back(w);
      }
      sym = std::move(next);
    }
    for (const auto& [p, d] : delta) {
      if (d == 0) continue;
      int64_t& count = pair_count[p];
      count += d;
      // Decreases are caught lazily when the stale entry is popped; increases need an entry.
      if (d > 0) heap.push({count, p});
    }
  }

  TokenizerSpec spec;
  spec.pattern = SplitPattern::kLlama3;
  spec.vocab.reserve(id_to_token.size());
  for (size_t id = 0; id < id_to_token.size(); ++id) {
    spec.vocab.emplace_back(id_to_token[id], static_cast<int32_t>(id));
  }
  spec.merges = std::move(merges);
  for (int k = 0; k < num_specials; ++k) {
    spec.added_tokens.push_back(
        {static_cast<int32_t>(id_to_token.size()) + k, std::move(special_tokens[k]), true});
  }
  return Tokenizer::Create(std::move(spec));
}

}  // namespace vtoken::model
