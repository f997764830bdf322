#include "lib/engine/tasks.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <utility>

#include "lib/engine/rng.h"
#include "lib/engine/task_filler.h"
#include "lib/engine/task_words.h"
#include "lib/engine/workload_options.h"

namespace vtoken::engine {
namespace {

// Random streams of one instance: what the task draws (keys, numbers, lists) and where its
// haystack starts in a corpus.
constexpr uint64_t kTaskStream = 0x7a5c;
constexpr uint64_t kCorpusStream = 0x7a5d;

constexpr int64_t kMinContextTokens = 128;
constexpr int64_t kMinHaystackTokens = 32;

// What a task puts in its haystack for a given number of filler units: the units in order
// (needles included), the expected answer, and where the target needle is.
struct Body {
  std::vector<std::string> units;
  std::vector<std::string> expected;
  int64_t target = -1;  // index in units of the target needle; -1 for list tasks
};

// A task's fixed texts and how its haystack grows.
struct Spec {
  std::string instruction;
  std::string question;
  TaskScoring scoring = TaskScoring::kAll;
  int64_t max_tokens = 0;
  std::function<Body(int64_t n)> body;
};

int64_t Count(const model::Tokenizer& tok, const std::string& text) {
  return static_cast<int64_t>(tok.Encode(text).size());
}

// Inserts `needles` (depth, text) among filler units 0..n-1, each before the first unit at or
// after its depth's share of the filler's tokens (needles of equal depth keep their order).
// Needle 0 is the target.
Body PlaceNeedles(const Filler& filler, const std::vector<int64_t>& unit_tokens, int64_t n,
                  const std::vector<std::pair<double, std::string>>& needles,
                  std::vector<std::string> expected) {
  int64_t total = 0;
  for (int64_t i = 0; i < n; ++i) total += unit_tokens[i];
  std::vector<int64_t> at(needles.size());  // filler units before each needle
  for (size_t k = 0; k < needles.size(); ++k) {
    const double want = needles[k].first * static_cast<double>(total);
    int64_t before = 0, best = 0;
    double best_err = want;
    for (int64_t i = 0; i < n; ++i) {
      before += unit_tokens[i];
      const double err = std::abs(static_cast<double>(before) - want);
      if (err < best_err) {
        best_err = err;
        best = i + 1;
      }
    }
    at[k] = best;
  }
  std::vector<size_t> order(needles.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return at[a] < at[b]; });
  Body body;
  body.expected = std::move(expected);
  size_t next = 0;
  for (int64_t i = 0; i <= n; ++i) {
    while (next < order.size() && at[order[next]] == i) {
      if (order[next] == 0) body.target = static_cast<int64_t>(body.units.size());
      body.units.push_back(needles[order[next]].second);
      ++next;
    }
    if (i < n) body.units.push_back(filler.Unit(i));
  }
  return body;
}

std::string Join(const std::vector<std::string>& units, size_t begin, size_t end) {
  std::string s;
  for (size_t i = begin; i < end; ++i) s += units[i];
  return s;
}

}  // namespace

int64_t MaxShortfall(int64_t context_tokens) {
  return std::max<int64_t>(kMinShortfall, context_tokens / 100);
}

const char* TaskProtocolName(TaskProtocol p) {
  return p == TaskProtocol::kQuestionAware ? "question_aware" : "query_agnostic";
}

StatusOr<TaskProtocol> ParseTaskProtocol(std::string_view name) {
  if (name == "question_aware") return TaskProtocol::kQuestionAware;
  if (name == "query_agnostic") return TaskProtocol::kQueryAgnostic;
  return InvalidArgumentError("workload option protocol = \"" + std::string(name) +
                              "\": must be \"question_aware\" or \"query_agnostic\"");
}

const std::vector<std::string>& TaskNames() {
  static const std::vector<std::string> names = {
      "passkey",           "niah_single",  "niah_multikey", "niah_multivalue",
      "variable_tracking", "common_words", "frequent_words"};
  return names;
}

bool TaskHasDepth(std::string_view task) {
  return task != "common_words" && task != "frequent_words";
}

Status ValidateTaskOptions(const TaskOptions& o) {
  const auto& names = TaskNames();
  if (std::find(names.begin(), names.end(), o.task) == names.end()) {
    std::string list;
    for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
    return WorkloadOptionError("task", "\"" + o.task + "\"", "unknown task (known: " + list + ")");
  }
  if (o.filler != "repeat" && o.filler != "corpus") {
    return WorkloadOptionError("filler", "\"" + o.filler + "\"",
                               "must be \"repeat\" or \"corpus\"");
  }
  if (o.filler == "corpus" && o.corpus_path.empty()) {
    return WorkloadOptionError("filler", "\"corpus\"", "needs workload.corpus (a text file)");
  }
  if (o.context_tokens < kMinContextTokens || o.context_tokens > kMaxRequestTokens) {
    return WorkloadOptionError("context_tokens", std::to_string(o.context_tokens),
                               "must be in [" + std::to_string(kMinContextTokens) + ", " +
                                   std::to_string(kMaxRequestTokens) + "]");
  }
  return Status::Ok();
}

StatusOr<TaskInstance> MakeTaskInstance(const TaskOptions& o, const model::Tokenizer& tok,
                                        uint64_t seed, int64_t index, double depth) {
  VTOKEN_RETURN_IF_ERROR(ValidateTaskOptions(o));
  if (!(depth >= 0.0 && depth <= 1.0)) {
    return WorkloadOptionError("depths", std::to_string(depth), "every depth must be in [0, 1]");
  }
  const uint64_t instance_seed = seed ^ (static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull);
  // The haystack's filler: a corpus only for the needle tasks that ask for it.
  std::unique_ptr<Filler> filler = std::make_unique<RepeatFiller>();
  if (o.filler == "corpus" && o.task.rfind("niah_", 0) == 0) {
    Rng corpus_rng(instance_seed, kCorpusStream);
    VTOKEN_ASSIGN_OR_RETURN(std::unique_ptr<CorpusFiller> c,
                            CorpusFiller::Read(o.corpus_path, corpus_rng));
    filler = std::move(c);
  }
  std::vector<int64_t> unit_tokens;  // of filler units 0, 1, ... (grown on demand)
  auto filler_tokens = [&](int64_t n) -> const std::vector<int64_t>& {
    while (static_cast<int64_t>(unit_tokens.size()) < n) {
      unit_tokens.push_back(Count(tok, filler->Unit(static_cast<int64_t>(unit_tokens.size()))));
    }
    return unit_tokens;
  };

  // Everything the task draws comes from one stream, in the same order for every n, so the
  // answer does not change while the length search varies n.
  Spec spec;
  const std::string& task = o.task;
  if (task == "passkey") {
    Rng rng(instance_seed, kTaskStream);
    const std::string key = RandomNumber(rng, 5);
    spec.instruction =
        "There is a pass key hidden inside a lot of irrelevant text. Find it and memorize it. "
        "I will quiz you about the pass key.";
    spec.question = "What is the pass key? Answer with the number only.";
    spec.max_tokens = 16;
    spec.body = [&, key](int64_t n) {
      return PlaceNeedles(
          *filler, filler_tokens(n), n,
          {{depth, " The pass key is " + key + ". Remember it. " + key + " is the pass key."}},
          {key});
    };
  } else if (task.rfind("niah_", 0) == 0) {
    Rng rng(instance_seed, kTaskStream);
    KeyDrawer keys(rng);
    const std::string key = keys.Next();
    std::vector<std::pair<double, std::string>> needles;
    std::vector<std::string> expected;
    auto needle = [](const std::string& k, const std::string& v) {
      return " One of the special magic numbers for " + k + " is: " + v + ".";
    };
    const std::string value = RandomNumber(rng, 7);
    needles.push_back({depth, needle(key, value)});
    expected.push_back(value);
    if (task == "niah_multikey") {
      for (int i = 0; i < 3; ++i)
        needles.push_back({rng.Uniform(), needle(keys.Next(), RandomNumber(rng, 7))});
    } else if (task == "niah_multivalue") {
      for (int i = 0; i < 3; ++i) {
        std::string v;
        do {
          v = RandomNumber(rng, 7);
        } while (std::find(expected.begin(), expected.end(), v) != expected.end());
        needles.push_back({rng.Uniform(), needle(key, v)});
        expected.push_back(v);
      }
    }
    spec.instruction =
        "Some special magic numbers are hidden within the following text. Make sure to memorize "
        "them. I will quiz you about the numbers afterwards.";
    spec.question = task == "niah_multivalue"
                        ? "What are all the special magic numbers for " + key +
                              " mentioned in the text above? Answer with the numbers only."
                        : "What is the special magic number for " + key +
                              " mentioned in the text above? Answer with the number only.";
    spec.max_tokens = task == "niah_multivalue" ? 96 : 24;  // 4 numbers of 7 digit tokens, listed
    spec.body = [&, needles, expected](int64_t n) {
      return PlaceNeedles(*filler, filler_tokens(n), n, needles, expected);
    };
  } else if (task == "variable_tracking") {
    Rng rng(instance_seed, kTaskStream);
    constexpr int kHops = 4;
    std::set<std::string> names_seen;
    std::vector<std::string> names;
    while (names.size() < kHops + 1) {
      std::string name;
      for (int i = 0; i < 5; ++i) name += static_cast<char>('A' + rng.UniformInt(0, 25));
      if (names_seen.insert(name).second) names.push_back(name);
    }
    const std::string value = RandomNumber(rng, 5);
    std::vector<std::pair<double, std::string>> needles;
    needles.push_back({depth, " VAR " + names[0] + " = " + value + "."});
    for (int k = 1; k <= kHops; ++k) {
      needles.push_back(
          {depth + (1.0 - depth) * k / kHops, " VAR " + names[k] + " = VAR " + names[k - 1] + "."});
    }
    spec.instruction =
        "Memorize and track the chain of variable assignments hidden in the following text.";
    spec.question = "Which variables are assigned the value " + value +
                    " in the text above, directly or through other variables? Answer with the "
                    "variable names only.";
    spec.max_tokens = 48;
    spec.body = [&, needles, names](int64_t n) {
      return PlaceNeedles(*filler, filler_tokens(n), n, needles, names);
    };
  } else if (task == "common_words") {
    spec.instruction =
        "Below is a numbered list of words. Some words appear many times in it, the others only "
        "a few times.";
    spec.question =
        "What are the 10 most common words in the list above? Answer with the words only.";
    spec.max_tokens = 96;
    spec.body = [instance_seed](int64_t n) {
      Rng rng(instance_seed, kTaskStream);
      constexpr int64_t kCommon = 10, kRare = 2;
      const int64_t freq = std::clamp<int64_t>(n / 20, 3, 30);
      const int64_t rare_entries = std::max<int64_t>(0, n - kCommon * freq);
      const int64_t rare_words = (rare_entries + kRare - 1) / kRare;
      std::vector<std::string> words = PseudoWords(rng, kCommon + rare_words);
      std::vector<std::string> entries;
      for (int64_t w = 0; w < kCommon; ++w) entries.insert(entries.end(), freq, words[w]);
      for (int64_t e = 0; e < rare_entries; ++e) entries.push_back(words[kCommon + e / kRare]);
      Shuffle(rng, entries);
      Body body;
      for (size_t i = 0; i < entries.size(); ++i) {
        // Appended, not " " + ...: GCC 12 warns falsely (-Wrestrict) on operator+(const char*,
        // std::string&&) here.
        std::string unit = " ";
        unit += std::to_string(i + 1);
        unit += ". ";
        unit += entries[i];
        body.units.push_back(std::move(unit));
      }
      body.expected.assign(words.begin(), words.begin() + kCommon);
      return body;
    };
  } else {  // frequent_words
    spec.instruction =
        "Read the following coded text and keep track of how often each coded word appears.";
    spec.question =
        "What are the three most frequently appearing coded words in the text above? Answer "
        "with the words only.";
    spec.max_tokens = 48;
    spec.body = [instance_seed](int64_t n) {
      Rng rng(instance_seed, kTaskStream);
      const int64_t vocab = std::max<int64_t>(50, n / 4);
      const std::vector<std::string> words = PseudoWords(rng, vocab);
      std::vector<double> cdf(vocab);  // Zipf with exponent 2 over the ranks
      double sum = 0;
      for (int64_t r = 0; r < vocab; ++r)
        cdf[r] = sum += 1.0 / static_cast<double>((r + 1) * (r + 1));
      while (true) {  // until the top 3 are strictly more frequent than the rest
        std::vector<int64_t> drawn(n), count(vocab, 0);
        for (int64_t i = 0; i < n; ++i) {
          const double u = rng.Uniform() * sum;
          drawn[i] = std::min<int64_t>(vocab - 1,
                                       std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
          ++count[drawn[i]];
        }
        std::vector<int64_t> rank(vocab);
        for (int64_t r = 0; r < vocab; ++r) rank[r] = r;
        std::stable_sort(rank.begin(), rank.end(),
                         [&](int64_t a, int64_t b) { return count[a] > count[b]; });
        if (n >= 4 && count[rank[2]] <= count[rank[3]]) continue;
        Body body;
        for (int64_t i = 0; i < n; ++i) body.units.push_back(" " + words[drawn[i]]);
        for (int k = 0; k < 3; ++k) body.expected.push_back(words[rank[k]]);
        return body;
      }
    };
  }

  // The text of n filler units, and its token count: the largest n whose text fits.
  const std::string head = spec.instruction + "\n\n";
  const std::string question_text = spec.question;
  const std::vector<int32_t> question_ids = tok.Encode(question_text);
  struct Built {
    Body body;
    std::string context;
    std::vector<int32_t> ids;
    int64_t total = 0;
  };
  auto build = [&](int64_t n) {
    Built b;
    b.body = spec.body(n);
    b.context = head + Join(b.body.units, 0, b.body.units.size()) + "\n\n";
    b.ids = tok.Encode(b.context);
    b.total = static_cast<int64_t>(b.ids.size() + question_ids.size());
    return b;
  };
  const int64_t fixed = build(0).total;
  const int64_t target = o.context_tokens;
  if (target - fixed < kMinHaystackTokens) {
    return WorkloadOptionError("context_tokens", std::to_string(target),
                               "too small for task " + task +
                                   ": its instruction, question and needles "
                                   "take " +
                                   std::to_string(fixed) + " tokens, and the haystack needs " +
                                   std::to_string(kMinHaystackTokens) + " more");
  }
  // Largest n with total(n) <= target, by doubling then bisection (total grows with n).
  int64_t lo = 0, hi = 1;
  while (build(hi).total <= target) {
    lo = hi;
    hi *= 2;
  }
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (build(mid).total <= target ? lo : hi) = mid;
  }
  Built best = build(lo);
  if (target - best.total > MaxShortfall(target)) {
    return InternalError("task " + task + ": could not fill " + std::to_string(target) +
                         " tokens to within " + std::to_string(MaxShortfall(target)) +
                         " (reached " + std::to_string(best.total) + ")");
  }

  TaskInstance t;
  t.task = task;
  t.context = std::move(best.context);
  t.question = question_text;
  t.context_ids = std::move(best.ids);
  t.question_ids = question_ids;
  t.expected = best.body.expected;
  t.scoring = spec.scoring;
  t.max_tokens = spec.max_tokens;
  if (TaskHasDepth(task)) {
    t.depth = depth;
    // The haystack's tokens before the target needle, over all its filler tokens.
    const Body& b = best.body;
    const int64_t head_tokens = Count(tok, head);
    const int64_t before =
        Count(tok, head + Join(b.units, 0, static_cast<size_t>(b.target))) - head_tokens;
    int64_t needles_before = 0, needle_tokens = 0;
    const Body bare = spec.body(0);  // the needles alone, in order
    for (const std::string& u : bare.units) needle_tokens += Count(tok, u);
    for (int64_t i = 0; i < b.target; ++i) {
      if (std::find(bare.units.begin(), bare.units.end(), b.units[i]) != bare.units.end()) {
        needles_before += Count(tok, b.units[i]);
      }
    }
    const int64_t haystack =
        Count(tok, head + Join(b.units, 0, b.units.size())) - head_tokens - needle_tokens;
    t.needle_depth =
        haystack > 0 ? static_cast<double>(before - needles_before) / static_cast<double>(haystack)
                     : 0.0;
  }
  return t;
}

}  // namespace vtoken::engine
