// Helpers of the workload tests (workload_test and the tests of its parts: request_lengths_test,
// arrivals_test, prompt_source_test, jsonl_workload_test, workload_options_test,
// task_workload_test, perplexity_workload_test): a byte-level tokenizer, a temporary directory
// per test, a corpus file.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "lib/engine/workload.h"
#include "lib/model/io/pretokenizer.h"
#include "lib/model/io/tokenizer.h"

namespace vtoken::engine {

// One token per byte (id == byte value, no merges): token counts equal byte counts, so corpus
// cuts and JSONL lengths can be checked exactly.
inline model::Tokenizer ByteTokenizer() {
  model::TokenizerSpec spec;
  for (int b = 0; b < 256; ++b) spec.vocab.emplace_back(model::ByteToUnicode(b), b);
  return std::move(model::Tokenizer::Create(std::move(spec))).value();
}

inline uint64_t RandomSeed() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) | rd();
}

struct Moments {
  double mean = 0;
  double stddev = 0;
};

inline Moments MomentsOf(const std::vector<double>& v) {
  Moments m;
  for (double x : v) m.mean += x;
  m.mean /= static_cast<double>(v.size());
  for (double x : v) m.stddev += (x - m.mean) * (x - m.mean);
  m.stddev = std::sqrt(m.stddev / static_cast<double>(v.size() - 1));
  return m;
}

inline std::vector<Request> MustGenerate(const WorkloadOptions& o,
                                         const model::Tokenizer* tokenizer, int64_t vocab_size) {
  auto r = GenerateWorkload(o, tokenizer, vocab_size);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : std::vector<Request>{};
}

// Options whose requests are tiny, for tests about arrivals.
inline WorkloadOptions TinyRequests(int64_t n, uint64_t seed) {
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
    dir_ = std::filesystem::temp_directory_path() /
           ("vtoken_workload_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

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

  std::filesystem::path dir_;
  std::string corpus_text_;
};

}  // namespace vtoken::engine
