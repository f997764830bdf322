#include "lib/engine/workload.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "lib/model/io/pretokenizer.h"

namespace vtoken::engine {
namespace {

namespace fs = std::filesystem;

// One token per byte (id == byte value, no merges): token counts equal byte counts, so corpus
// cuts and JSONL lengths can be checked exactly.
model::Tokenizer ByteTokenizer() {
  model::TokenizerSpec spec;
  for (int b = 0; b < 256; ++b) spec.vocab.emplace_back(model::ByteToUnicode(b), b);
  return std::move(model::Tokenizer::Create(std::move(spec))).value();
}

uint64_t RandomSeed() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) | rd();
}

struct Moments {
  double mean = 0;
  double stddev = 0;
};

Moments MomentsOf(const std::vector<double>& v) {
  Moments m;
  for (double x : v) m.mean += x;
  m.mean /= static_cast<double>(v.size());
  for (double x : v) m.stddev += (x - m.mean) * (x - m.mean);
  m.stddev = std::sqrt(m.stddev / static_cast<double>(v.size() - 1));
  return m;
}

std::vector<Request> MustGenerate(const WorkloadOptions& o, const model::Tokenizer* tokenizer,
                                  int64_t vocab_size) {
  auto r = GenerateWorkload(o, tokenizer, vocab_size);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : std::vector<Request>{};
}

// Options whose requests are tiny, for tests about arrivals.
WorkloadOptions TinyRequests(int64_t n, uint64_t seed) {
  WorkloadOptions o;
  o.num_requests = n;
  o.seed = seed;
  o.input_mean = 2;
  o.output_mean = 2;
  o.length_sigma = 0;
  return o;
}

class WorkloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("vtoken_workload_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& content) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }

  std::string Corpus() {
    std::string text = "Chapter 1\n\n";
    for (int i = 1; i <= 200; ++i) {
      text += std::to_string(i) + " verse " + std::to_string(i * 7919 % 1000) +
              " and the words went on.\n";
    }
    corpus_text_ = text;
    return Write("corpus.txt", text);
  }

  fs::path dir_;
  std::string corpus_text_;
};

void ExpectSameRequests(const std::vector<Request>& a, const std::vector<Request>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].id, b[i].id);
    EXPECT_EQ(a[i].prompt, b[i].prompt);
    EXPECT_EQ(a[i].prompt_tokens, b[i].prompt_tokens);
    EXPECT_EQ(a[i].max_tokens, b[i].max_tokens);
    EXPECT_EQ(a[i].reference, b[i].reference);
    EXPECT_EQ(a[i].arrival_s, b[i].arrival_s);
    EXPECT_EQ(a[i].prefix_group, b[i].prefix_group);
    EXPECT_EQ(a[i].shared_prefix_tokens, b[i].shared_prefix_tokens);
  }
}

TEST_F(WorkloadTest, DeterministicPerSeed) {
  const model::Tokenizer tok = ByteTokenizer();
  WorkloadOptions o;
  o.num_requests = 16;
  o.arrival = "gamma";
  o.rate = 3;
  o.gamma_cv = 2;
  o.prefix_sharing_degree = 2;
  o.corpus_path = Corpus();
  for (const model::Tokenizer* t : {static_cast<const model::Tokenizer*>(nullptr), &tok}) {
    const auto a = MustGenerate(o, t, 1000);
    ExpectSameRequests(a, MustGenerate(o, t, 1000));
    WorkloadOptions other = o;
    other.seed = 2;
    const auto c = MustGenerate(other, t, 1000);
    ASSERT_EQ(c.size(), a.size());
    int same = 0;
    for (size_t i = 0; i < a.size(); ++i) same += a[i].prompt_tokens == c[i].prompt_tokens;
    EXPECT_LT(same, 2);
  }
}

TEST_F(WorkloadTest, FixedSeedGivesTheSameNumbersEverywhere) {
  // Pins the PRNG and transforms: these values must not change across platforms or releases.
  WorkloadOptions o = TinyRequests(3, 7);
  o.kind = "longbench_like";
  o.input_min = 10;
  o.input_max = 20;
  o.output_min = 1;
  o.output_max = 5;
  const auto r = MustGenerate(o, nullptr, 50);
  ASSERT_EQ(r.size(), 3u);
  std::vector<int64_t> lengths;
  for (const Request& q : r) {
    lengths.push_back(static_cast<int64_t>(q.prompt_tokens.size()));
    lengths.push_back(q.max_tokens);
  }
  EXPECT_EQ(lengths, (std::vector<int64_t>{12, 4, 14, 5, 11, 4}));
}

TEST_F(WorkloadTest, ShareGptLikeLengthsMatchTheirMeans) {
  const uint64_t seed = RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  WorkloadOptions o;
  o.num_requests = 20000;
  o.seed = seed;
  const auto r = MustGenerate(o, nullptr, 32000);
  ASSERT_EQ(r.size(), 20000u);
  std::vector<double> in, out;
  for (const Request& q : r) {
    ASSERT_GE(q.prompt_tokens.size(), 1u);
    ASSERT_GE(q.max_tokens, 1);
    in.push_back(static_cast<double>(q.prompt_tokens.size()));
    out.push_back(static_cast<double>(q.max_tokens));
    EXPECT_EQ(q.prefix_group, -1);
    EXPECT_EQ(q.arrival_s, 0.0);
    EXPECT_FALSE(q.reference.has_value());
    EXPECT_TRUE(q.prompt.empty());
  }
  // Lognormal sigma 0.8: stddev = mean * sqrt(e^0.64 - 1) ~ 0.95 mean, so the standard error of
  // the mean is ~0.7% of it; 5% is a > 7 sigma margin.
  EXPECT_NEAR(MomentsOf(in).mean, 230.0, 0.05 * 230.0);
  EXPECT_NEAR(MomentsOf(out).mean, 200.0, 0.05 * 200.0);
  EXPECT_NEAR(MomentsOf(in).stddev / MomentsOf(in).mean, 0.947, 0.15);
}

TEST_F(WorkloadTest, LongBenchLikeLengthsAreUniformInTheirRanges) {
  const uint64_t seed = RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  WorkloadOptions o;
  o.kind = "longbench_like";
  o.num_requests = 4000;
  o.seed = seed;
  o.input_min = 600;
  o.input_max = 900;
  const auto r = MustGenerate(o, nullptr, 2048);
  std::vector<double> in, out;
  for (const Request& q : r) {
    ASSERT_GE(q.prompt_tokens.size(), 600u);
    ASSERT_LE(q.prompt_tokens.size(), 900u);
    ASSERT_GE(q.max_tokens, 128);
    ASSERT_LE(q.max_tokens, 512);
    for (int32_t id : q.prompt_tokens) ASSERT_TRUE(id >= 0 && id < 2048) << id;
    in.push_back(static_cast<double>(q.prompt_tokens.size()));
    out.push_back(static_cast<double>(q.max_tokens));
  }
  // Uniform: mean 750 (sd 87, s.e. 1.4) and 320 (sd 111, s.e. 1.8).
  EXPECT_NEAR(MomentsOf(in).mean, 750.0, 10.0);
  EXPECT_NEAR(MomentsOf(out).mean, 320.0, 12.0);
  EXPECT_NEAR(MomentsOf(in).stddev, 300.0 / std::sqrt(12.0), 8.0);

  WorkloadOptions defaults;
  defaults.kind = "longbench_like";
  defaults.num_requests = 8;
  defaults.seed = seed;
  for (const Request& q : MustGenerate(defaults, nullptr, 100)) {
    EXPECT_GE(q.prompt_tokens.size(), 2048u);
    EXPECT_LE(q.prompt_tokens.size(), 16384u);
  }
}

TEST_F(WorkloadTest, AllArriveAtZero) {
  for (const Request& q : MustGenerate(TinyRequests(10, 1), nullptr, 10)) {
    EXPECT_EQ(q.arrival_s, 0.0);
  }
}

std::vector<double> Gaps(const std::vector<Request>& r) {
  std::vector<double> gaps;
  for (size_t i = 1; i < r.size(); ++i) gaps.push_back(r[i].arrival_s - r[i - 1].arrival_s);
  return gaps;
}

TEST_F(WorkloadTest, PoissonArrivals) {
  const uint64_t seed = RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  WorkloadOptions o = TinyRequests(20001, seed);
  o.arrival = "poisson";
  o.rate = 4;
  const auto r = MustGenerate(o, nullptr, 10);
  EXPECT_EQ(r[0].arrival_s, 0.0);
  const std::vector<double> gaps = Gaps(r);
  for (double g : gaps) ASSERT_GE(g, 0.0);
  // Exponential gaps: mean = sd = 1/rate = 0.25; s.e. of the mean 0.0018.
  const Moments m = MomentsOf(gaps);
  EXPECT_NEAR(m.mean, 0.25, 0.0125);
  EXPECT_NEAR(m.stddev / m.mean, 1.0, 0.05);
}

TEST_F(WorkloadTest, GammaArrivals) {
  const uint64_t seed = RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (double cv : {0.5, 2.0}) {  // shape 4 and 0.25: both branches of the gamma sampler
    SCOPED_TRACE("cv " + std::to_string(cv));
    WorkloadOptions o = TinyRequests(20001, seed);
    o.arrival = "gamma";
    o.rate = 4;
    o.gamma_cv = cv;
    const std::vector<double> gaps = Gaps(MustGenerate(o, nullptr, 10));
    for (double g : gaps) ASSERT_GE(g, 0.0);
    const Moments m = MomentsOf(gaps);
    EXPECT_NEAR(m.mean, 0.25, 0.25 * 0.05 * cv);
    EXPECT_NEAR(m.stddev / m.mean, cv, 0.1 * cv);
  }
}

// Checks the prefix-group contract on any workload.
void ExpectPrefixGroups(const std::vector<Request>& r, int32_t degree, double fraction) {
  for (size_t first = 0; first < r.size(); first += degree) {
    const size_t last = std::min(first + degree, r.size());
    size_t shortest = SIZE_MAX;
    for (size_t i = first; i < last; ++i) shortest = std::min(shortest, r[i].prompt_tokens.size());
    const auto shared = static_cast<int64_t>(std::floor(fraction * static_cast<double>(shortest)));
    for (size_t i = first; i < last; ++i) {
      EXPECT_EQ(r[i].prefix_group, static_cast<int32_t>(first / degree)) << "request " << i;
      EXPECT_EQ(r[i].shared_prefix_tokens, shared) << "request " << i;
      ASSERT_GT(r[i].prompt_tokens.size(), static_cast<size_t>(shared)) << "request " << i;
      for (size_t j = first; j < i; ++j) {
        EXPECT_TRUE(std::equal(r[i].prompt_tokens.begin(), r[i].prompt_tokens.begin() + shared,
                               r[j].prompt_tokens.begin()))
            << "requests " << j << " and " << i << " differ inside the prefix";
        EXPECT_NE(r[i].prompt_tokens[shared], r[j].prompt_tokens[shared])
            << "requests " << j << " and " << i << " agree right after the prefix";
      }
    }
  }
}

TEST_F(WorkloadTest, PrefixGroupsShareExactlyTheirPrefix) {
  for (int32_t degree : {2, 4, 8}) {
    SCOPED_TRACE("degree " + std::to_string(degree));
    WorkloadOptions o;
    o.num_requests = 30;  // the last group is partial
    o.prefix_sharing_degree = degree;
    o.shared_prefix_fraction = 0.75;
    // An 8-token vocabulary makes accidental agreement after the prefix likely, so the
    // "differ" guarantee is really exercised.
    const auto r = MustGenerate(o, nullptr, 8);
    ExpectPrefixGroups(r, degree, 0.75);
  }
  WorkloadOptions none;
  for (const Request& q : MustGenerate(none, nullptr, 8)) {
    EXPECT_EQ(q.prefix_group, -1);
    EXPECT_EQ(q.shared_prefix_tokens, 0);
  }
}

TEST_F(WorkloadTest, PrefixGroupsFromCorpus) {
  const model::Tokenizer tok = ByteTokenizer();
  WorkloadOptions o;
  o.num_requests = 12;
  o.prefix_sharing_degree = 4;
  o.shared_prefix_fraction = 0.5;
  o.corpus_path = Corpus();
  const auto r = MustGenerate(o, &tok, 0);
  ExpectPrefixGroups(r, 4, 0.5);
  for (const Request& q : r) EXPECT_EQ(q.prompt, tok.Decode(q.prompt_tokens));
}

TEST_F(WorkloadTest, ChatWrapsEveryPromptBetweenTheTemplatesTokens) {
  const model::Tokenizer tok = ByteTokenizer();
  WorkloadOptions o;
  o.num_requests = 8;
  o.prefix_sharing_degree = 2;
  o.corpus_path = Corpus();
  const auto plain = MustGenerate(o, &tok, 0);
  o.chat = true;
  o.chat_prefix = "<user>\n";
  o.chat_suffix = "</user><bot>";
  const auto chat = MustGenerate(o, &tok, 0);
  ASSERT_EQ(chat.size(), plain.size());
  for (size_t i = 0; i < chat.size(); ++i) {
    // One token per byte: the content's tokens sit between 7 and 12 template tokens, unchanged.
    std::vector<int32_t> want = tok.Encode("<user>\n");
    want.insert(want.end(), plain[i].prompt_tokens.begin(), plain[i].prompt_tokens.end());
    const std::vector<int32_t> after = tok.Encode("</user><bot>");
    want.insert(want.end(), after.begin(), after.end());
    EXPECT_EQ(chat[i].prompt_tokens, want) << i;
    EXPECT_EQ(chat[i].prompt, "<user>\n" + plain[i].prompt + "</user><bot>");
    EXPECT_EQ(chat[i].max_tokens, plain[i].max_tokens);
    // The template's first tokens are shared too.
    EXPECT_EQ(chat[i].shared_prefix_tokens, plain[i].shared_prefix_tokens + 7) << i;
  }
  o.chat_prefix.clear();
  o.chat_suffix.clear();
  EXPECT_EQ(GenerateWorkload(o, &tok, 0).status().code(), StatusCode::kInvalidArgument);
  o.chat_prefix = "x";
  EXPECT_EQ(GenerateWorkload(o, nullptr, 300).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(WorkloadTest, CorpusPromptsStartAtALineAndHaveTheSampledLength) {
  const model::Tokenizer tok = ByteTokenizer();
  WorkloadOptions o;
  o.num_requests = 40;
  o.corpus_path = Corpus();
  const auto with_corpus = MustGenerate(o, &tok, 0);
  const auto ids_only = MustGenerate(o, nullptr, 256);  // same seed, same lengths
  ASSERT_EQ(with_corpus.size(), 40u);
  const std::string doubled = corpus_text_ + corpus_text_ + corpus_text_;
  for (size_t i = 0; i < with_corpus.size(); ++i) {
    const Request& q = with_corpus[i];
    EXPECT_EQ(q.prompt_tokens.size(), ids_only[i].prompt_tokens.size());
    EXPECT_EQ(q.max_tokens, ids_only[i].max_tokens);
    EXPECT_EQ(q.prompt.size(), q.prompt_tokens.size());  // one byte per token
    const size_t at = doubled.find(q.prompt);
    ASSERT_NE(at, std::string::npos) << q.prompt;
    EXPECT_TRUE(at == 0 || doubled[at - 1] == '\n') << q.prompt;
    EXPECT_NE(q.prompt.front(), '\n');  // blank lines are never a start
  }
}

TEST_F(WorkloadTest, CorpusErrors) {
  const model::Tokenizer tok = ByteTokenizer();
  WorkloadOptions o;
  auto r = GenerateWorkload(o, &tok, 0);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("corpus_path"), std::string::npos);
  o.corpus_path = (dir_ / "missing.txt").string();
  r = GenerateWorkload(o, &tok, 0);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(), "corpus " + o.corpus_path + ": cannot be read");
  o.corpus_path = Write("blank.txt", "\n  \n\n");
  r = GenerateWorkload(o, &tok, 0);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(r.status().message(), "corpus " + o.corpus_path + " has no text");
  o.corpus_path = Write("binary.bin", std::string("ELF\x7f\n\x01\x00\x00 data\n", 14));
  r = GenerateWorkload(o, &tok, 0);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(r.status().message(),
            "corpus " + o.corpus_path + " is not UTF-8 text (byte 0x00 at offset 6)");
  o.corpus_path = Write("latin1.txt", "caf\xe9 au lait\n");
  r = GenerateWorkload(o, &tok, 0);
  EXPECT_EQ(r.status().message(),
            "corpus " + o.corpus_path + " is not UTF-8 text (byte 0xe9 at offset 3)");
  o.corpus_path = Write("utf8.txt", "caf\xc3\xa9 au lait, \xe2\x80\x9cquoted\xe2\x80\x9d\n");
  EXPECT_TRUE(GenerateWorkload(o, &tok, 0).ok());
}

TEST(WorkloadOptionsTest, CountsAreBoundedBeforeArithmetic) {
  WorkloadOptions o;
  o.kind = "longbench_like";
  o.output_min = o.output_max = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(ValidateWorkloadOptions(o).message(),
            "workload option output_min = 9223372036854775807: must be <= 2147483647");
  o.output_min = o.output_max = kMaxRequestTokens;
  o.input_min = o.input_max = kMaxRequestTokens;
  o.num_requests = 2;
  ASSERT_TRUE(ValidateWorkloadOptions(o).ok());
  // The largest lengths still add up without overflow (the context check sees the true sum).
  o.max_total_tokens = 1024;
  const auto r = GenerateWorkload(o, nullptr, 100);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(static_cast<int64_t>((*r)[0].prompt_tokens.size()) + (*r)[0].max_tokens, 1024);
  o.input_mean = 1e300;
  o.kind = "sharegpt_like";
  EXPECT_EQ(ValidateWorkloadOptions(o).message(),
            "workload option input_mean = 1e+300: must be <= 2147483647");
}

TEST(WorkloadOptionsTest, WorkloadBytesGrowsWithRequestsAndLengths) {
  WorkloadOptions o;
  o.kind = "longbench_like";
  o.num_requests = 10;
  o.input_min = o.input_max = 1000;
  o.output_min = o.output_max = 100;
  const int64_t ten = WorkloadBytes(o);
  EXPECT_EQ(ten, 10 * (512 + 1000 * 8 + 100 * 128));
  o.num_requests = 100000000;
  EXPECT_EQ(WorkloadBytes(o), ten * 10000000);
  o.max_total_tokens = 500;  // Both lengths are cut to the total.
  EXPECT_EQ(WorkloadBytes(o), 100000000LL * (512 + 500 * 8 + 100 * 128));
}

TEST_F(WorkloadTest, MaxTotalTokensScalesLongRequestsDown) {
  WorkloadOptions o;
  o.kind = "longbench_like";
  o.num_requests = 200;
  o.input_min = 600;
  o.input_max = 900;
  const auto free = MustGenerate(o, nullptr, 100);
  o.max_total_tokens = 1024;
  const auto clamped = MustGenerate(o, nullptr, 100);
  int scaled = 0;
  for (size_t i = 0; i < free.size(); ++i) {
    const auto in = static_cast<int64_t>(free[i].prompt_tokens.size());
    const int64_t out = free[i].max_tokens;
    const auto in2 = static_cast<int64_t>(clamped[i].prompt_tokens.size());
    if (in + out <= 1024) {
      EXPECT_EQ(in2, in);
      EXPECT_EQ(clamped[i].max_tokens, out);
    } else {
      ++scaled;
      // e.g. 900 + 512 -> floor(900 * 1024 / 1412) = 652 and 1024 - 652 = 372.
      EXPECT_EQ(in2, in * 1024 / (in + out));
      EXPECT_EQ(clamped[i].max_tokens, 1024 - in2);
    }
  }
  EXPECT_GT(scaled, 50);
}

TEST_F(WorkloadTest, JsonlPlainAndShareGptFormats) {
  const model::Tokenizer tok = ByteTokenizer();
  const std::string path = Write(
      "w.jsonl",
      "{\"prompt\": \"Hello there\", \"max_tokens\": 7, \"reference\": \"General Kenobi\"}\n"
      "\n"
      "{\"prompt\": \"No limit given\"}\n"
      "{\"conversations\": [{\"from\": \"system\", \"value\": \"be nice\"}, "
      "{\"from\": \"human\", \"value\": \"Why?\"}, {\"from\": \"gpt\", \"value\": \"Because.\"}, "
      "{\"from\": \"human\", \"value\": \"ok\"}]}\n"
      "{\"conversations\": [{\"from\": \"human\", \"value\": \"Last one\"}]}\n"
      "{\"prompt\": \"never read: num_requests is 4\"}\n");
  WorkloadOptions o;
  o.kind = "jsonl";
  o.jsonl_path = path;
  o.num_requests = 4;
  o.jsonl_default_max_tokens = 33;
  const auto r = MustGenerate(o, &tok, 0);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].prompt, "Hello there");
  EXPECT_EQ(r[0].prompt_tokens, tok.Encode("Hello there"));
  EXPECT_EQ(r[0].max_tokens, 7);
  EXPECT_EQ(r[0].reference, "General Kenobi");
  EXPECT_EQ(r[1].prompt, "No limit given");
  EXPECT_EQ(r[1].max_tokens, 33);
  EXPECT_EQ(r[1].reference, std::nullopt);
  EXPECT_EQ(r[2].prompt, "Why?");
  EXPECT_EQ(r[2].reference, "Because.");
  EXPECT_EQ(r[2].max_tokens, 8);  // "Because." is 8 byte tokens
  EXPECT_EQ(r[3].prompt, "Last one");
  EXPECT_EQ(r[3].reference, std::nullopt);
  EXPECT_EQ(r[3].max_tokens, 33);
  for (size_t i = 0; i < r.size(); ++i) {
    EXPECT_EQ(r[i].id, static_cast<int64_t>(i));
    EXPECT_EQ(r[i].prefix_group, -1);
  }
  o.num_requests = 0;  // the whole file
  EXPECT_EQ(MustGenerate(o, &tok, 0).size(), 5u);
}

TEST_F(WorkloadTest, JsonlClampCutsThePrompt) {
  const model::Tokenizer tok = ByteTokenizer();
  WorkloadOptions o;
  o.kind = "jsonl";
  o.jsonl_path = Write("w.jsonl", "{\"prompt\": \"0123456789\", \"max_tokens\": 10}\n");
  o.max_total_tokens = 10;
  const auto r = MustGenerate(o, &tok, 0);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].prompt, "01234");  // floor(10 * 10 / 20) = 5 tokens
  EXPECT_EQ(r[0].prompt_tokens.size(), 5u);
  EXPECT_EQ(r[0].max_tokens, 5);
}

constexpr const char* kNeedsPrompt =
    "needs a string \"prompt\" (or ShareGPT \"conversations\", or LongBench \"context\" and "
    "\"input\")";

// ShareGPT as released (ShareGPT_V3_unfiltered_cleaned_split.json): one JSON array of objects.
TEST_F(WorkloadTest, JsonlReadsAShareGptJsonArray) {
  const model::Tokenizer tok = ByteTokenizer();
  WorkloadOptions o;
  o.kind = "jsonl";
  o.num_requests = 0;
  o.jsonl_path = Write(
      "sharegpt.json",
      "  [\n {\"id\": \"a1\", \"conversations\": [{\"from\": \"human\", \"value\": \"Hi?\"}, "
      "{\"from\": \"gpt\", \"value\": \"Hello.\"}]},\n"
      " {\"id\": \"b2\", \"conversations\": [{\"from\": \"user\", \"value\": \"Two\"}]}\n]\n");
  const auto r = MustGenerate(o, &tok, 0);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].prompt, "Hi?");
  EXPECT_EQ(r[0].reference, "Hello.");
  EXPECT_EQ(r[0].max_tokens, static_cast<int64_t>(tok.Encode("Hello.").size()));
  EXPECT_EQ(r[1].prompt, "Two");
  EXPECT_EQ(r[1].reference, std::nullopt);
  EXPECT_EQ(r[1].id, 1);
  o.jsonl_path = Write("bad.json", "[{\"id\": 1}, 3]");
  EXPECT_EQ(GenerateWorkload(o, &tok, 0).status().message(),
            o.jsonl_path + ": element 0: " + kNeedsPrompt);
  o.jsonl_path = Write("broken.json", "[{\"conversations\": []");
  EXPECT_EQ(GenerateWorkload(o, &tok, 0).status().message(),
            o.jsonl_path + ": not a valid JSON array");
}

// LongBench's released JSONL lines: the prompt template filled with context and input, the
// first answer as the reference.
TEST_F(WorkloadTest, JsonlReadsLongBenchLines) {
  const model::Tokenizer tok = ByteTokenizer();
  WorkloadOptions o;
  o.kind = "jsonl";
  o.jsonl_path = Write(
      "longbench.jsonl",
      "{\"input\": \"Who?\", \"context\": \"Ann met Bob.\", \"answers\": [\"Ann\", \"Bob\"], "
      "\"length\": 3, \"dataset\": \"narrativeqa\", \"language\": \"en\", \"all_classes\": null, "
      "\"_id\": \"x\"}\n"
      "{\"input\": \"\", \"context\": \"Only context.\", \"answers\": []}\n");
  auto r = MustGenerate(o, &tok, 0);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].prompt, "Ann met Bob.\n\nQuestion: Who?\nAnswer:");
  EXPECT_EQ(r[0].reference, "Ann");
  EXPECT_EQ(r[1].prompt, "Only context.\n\nQuestion: \nAnswer:");
  EXPECT_EQ(r[1].reference, std::nullopt);
  o.prompt_template = "Story: {context}\nQ: {input}\nA:";
  r = MustGenerate(o, &tok, 0);
  EXPECT_EQ(r[0].prompt, "Story: Ann met Bob.\nQ: Who?\nA:");
}

TEST_F(WorkloadTest, JsonlTruncateMiddleKeepsBothEnds) {
  const model::Tokenizer tok = ByteTokenizer();
  WorkloadOptions o;
  o.kind = "jsonl";
  o.jsonl_path = Write("w.jsonl", "{\"prompt\": \"0123456789\", \"max_tokens\": 10}\n"
                                  "{\"prompt\": \"ab\", \"max_tokens\": 2}\n");
  o.max_total_tokens = 10;
  o.truncate = "middle";
  const auto r = MustGenerate(o, &tok, 0);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].prompt, "01789");  // 5 tokens: the first 2 and the last 3
  EXPECT_EQ(r[0].truncated_from, 10);
  EXPECT_EQ(r[1].prompt, "ab");
  EXPECT_EQ(r[1].truncated_from, 0);
  o.truncate = "start";
  EXPECT_EQ(ValidateWorkloadOptions(o).message(),
            "workload option truncate = start: expected end or middle");
}

TEST_F(WorkloadTest, JsonlMalformedLinesNameFileAndLine) {
  const model::Tokenizer tok = ByteTokenizer();
  const std::string good = "{\"prompt\": \"fine\"}\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"prompt\": \"unterminated}", "not valid JSON"},
      {"[1, 2]", "expected a JSON object"},
      {"{\"text\": \"x\"}", kNeedsPrompt},
      {"{\"prompt\": 5}", kNeedsPrompt},
      {"{\"context\": \"c\"}", "a LongBench line needs string \"context\" and \"input\""},
      {"{\"context\": \"c\", \"input\": \"q\", \"answers\": \"a\"}",
       "\"answers\" must be an array of strings"},
      {"{\"prompt\": \"x\", \"max_tokens\": \"ten\"}",
       "\"max_tokens\" must be an integer in [1, 2147483647]"},
      {"{\"prompt\": \"x\", \"max_tokens\": 0}", "\"max_tokens\" must be an integer in [1, 2147483647]"},
      {"{\"prompt\": \"x\", \"max_tokens\": 9223372036854775807}",
       "\"max_tokens\" must be an integer in [1, 2147483647]"},
      {"{\"prompt\": \"x\", \"max_tokens\": 18446744073709551615}",
       "\"max_tokens\" must be an integer in [1, 2147483647]"},
      {"{\"prompt\": \"x\", \"reference\": 3}", "\"reference\" must be a string"},
      {"{\"prompt\": \"\"}", "the prompt encodes to no tokens"},
      {"{\"conversations\": {}}", "\"conversations\" is not an array"},
      {"{\"conversations\": [{\"from\": \"human\"}]}",
       "each conversation turn needs string \"from\" and \"value\""},
      {"{\"conversations\": [{\"from\": \"gpt\", \"value\": \"hi\"}]}",
       "conversation has no human turn"},
  };
  for (const auto& [line, why] : cases) {
    WorkloadOptions o;
    o.kind = "jsonl";
    o.jsonl_path = Write("bad.jsonl", good + "\n" + line + "\n" + good);
    auto r = GenerateWorkload(o, &tok, 0);
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << line;
    EXPECT_EQ(r.status().message(), o.jsonl_path + ":3: " + why) << line;
  }
}

TEST_F(WorkloadTest, JsonlFileErrors) {
  const model::Tokenizer tok = ByteTokenizer();
  WorkloadOptions o;
  o.kind = "jsonl";
  o.jsonl_path = (dir_ / "missing.jsonl").string();
  EXPECT_EQ(GenerateWorkload(o, &tok, 0).status().code(), StatusCode::kNotFound);
  o.jsonl_path = Write("empty.jsonl", "\n\n");
  auto r = GenerateWorkload(o, &tok, 0);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(r.status().message(), "workload " + o.jsonl_path + " holds no requests");
  r = GenerateWorkload(o, nullptr, 100);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("needs a tokenizer"), std::string::npos);
}

TEST(WorkloadOptionsTest, InvalidFieldsAreNamed) {
  const std::vector<std::pair<std::function<void(WorkloadOptions&)>, std::string>> cases = {
      {[](auto& o) { o.kind = "alpaca"; }, "workload option kind = alpaca: "},
      {[](auto& o) { o.num_requests = 0; }, "workload option num_requests = 0: "},
      {[](auto& o) { o.input_mean = 0; }, "workload option input_mean = 0: "},
      {[](auto& o) { o.output_mean = -1; }, "workload option output_mean = -1: "},
      {[](auto& o) { o.length_sigma = -0.5; }, "workload option length_sigma = -0.5: "},
      {[](auto& o) { o.input_min = 0; }, "workload option input_min = 0: "},
      {[](auto& o) { o.input_max = 100; }, "workload option input_max = 100: "},
      {[](auto& o) { o.output_min = 0; }, "workload option output_min = 0: "},
      {[](auto& o) { o.output_max = 5; }, "workload option output_max = 5: "},
      {[](auto& o) { o.max_total_tokens = 1; }, "workload option max_total_tokens = 1: "},
      {[](auto& o) { o.arrival = "burst"; }, "workload option arrival = burst: "},
      {[](auto& o) {
         o.arrival = "poisson";
         o.rate = 0;
       },
       "workload option rate = 0: "},
      {[](auto& o) {
         o.arrival = "gamma";
         o.gamma_cv = 0;
       },
       "workload option gamma_cv = 0: "},
      {[](auto& o) { o.prefix_sharing_degree = 0; }, "workload option prefix_sharing_degree = 0: "},
      {[](auto& o) { o.prefix_sharing_degree = 3; },
       "workload option prefix_sharing_degree = 3: must be 1, 2, 4 or 8"},
      {[](auto& o) { o.jsonl_path = "w.jsonl"; },
       "workload option jsonl = w.jsonl: is read only by kind jsonl (kind is sharegpt_like)"},
      {[](auto& o) { o.num_requests = 2147483648; },
       "workload option num_requests = 2147483648: must be <= 2147483647"},
      {[](auto& o) { o.length_sigma = 50; }, "workload option length_sigma = 50: must be in [0, 10]"},
      {[](auto& o) { o.shared_prefix_fraction = 1.0; },
       "workload option shared_prefix_fraction = 1: "},
      {[](auto& o) { o.kind = "jsonl"; }, "workload option jsonl_path = \"\": "},
      {[](auto& o) {
         o.kind = "jsonl";
         o.jsonl_path = "x";
         o.prefix_sharing_degree = 2;
       },
       "workload option prefix_sharing_degree = 2: "},
  };
  EXPECT_TRUE(ValidateWorkloadOptions(WorkloadOptions{}).ok());
  for (const auto& [mutate, prefix] : cases) {
    WorkloadOptions o;
    mutate(o);
    const Status s = ValidateWorkloadOptions(o);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << prefix;
    EXPECT_EQ(s.message().rfind(prefix, 0), 0u) << s.message();
    EXPECT_EQ(GenerateWorkload(o, nullptr, 100).status().message(), s.message());
  }
}

TEST(WorkloadOptionsTest, VocabTooSmallForDistinctContinuations) {
  WorkloadOptions o;
  o.prefix_sharing_degree = 4;
  auto r = GenerateWorkload(o, nullptr, 3);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message().rfind("vocab_size = 3: ", 0), 0u) << r.status().message();
  EXPECT_EQ(GenerateWorkload(WorkloadOptions{}, nullptr, 0).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vtoken::engine
