// `vtoken-cli train-tokenizer`: trains a byte-level BPE tokenizer on a text file and writes a
// Hugging Face tokenizer.json, then reports the compression it achieves on that same corpus.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "apps/vtoken-cli/commands/command.h"
#include "lib/model/io/bpe_trainer.h"
#include "lib/model/io/tokenizer.h"

namespace {

struct TrainTokenizerArgs {
  std::string corpus;
  int vocab_size = 2048;
  std::string out;
  std::vector<std::string> specials = {"<|begin_of_text|>", "<|end_of_text|>"};
};

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int RunTrainTokenizer(const TrainTokenizerArgs& args) {
  std::ifstream in(args.corpus, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "vtoken-cli: error: cannot open corpus '%s'\n", args.corpus.c_str());
    return 1;
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string corpus = buffer.str();

  auto start = std::chrono::steady_clock::now();
  auto tokenizer = vtoken::model::TrainByteLevelBpe(corpus, args.vocab_size, args.specials);
  if (!tokenizer.ok()) {
    vtoken::cli::PrintError(tokenizer.status());
    return 1;
  }
  const double train_s = SecondsSince(start);
  if (auto st = tokenizer->Save(args.out); !st.ok()) {
    vtoken::cli::PrintError(st);
    return 1;
  }

  start = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tokenizer->Encode(corpus);
  const double encode_s = SecondsSince(start);
  const bool round_trip = tokenizer->Decode(ids) == corpus;

  std::printf("wrote %s\n", args.out.c_str());
  std::printf("vocab size      %d (%zu special)\n", tokenizer->vocab_size(), args.specials.size());
  std::printf("merges          %d\n", tokenizer->num_merges());
  std::printf("corpus          %zu bytes -> %zu tokens\n", corpus.size(), ids.size());
  std::printf("compression     %.3f bytes/token\n",
              ids.empty() ? 0.0 : static_cast<double>(corpus.size()) / ids.size());
  std::printf("round trip      %s\n", round_trip ? "ok" : "MISMATCH");
  std::printf("train time      %.2f s\n", train_s);
  std::printf("encode time     %.2f s (%.1f MB/s)\n", encode_s, corpus.size() / 1e6 / encode_s);
  return round_trip ? 0 : 1;
}

CLI::App* SetupTrainTokenizer(CLI::App& app) {
  auto args = std::make_shared<TrainTokenizerArgs>();
  CLI::App* cmd = app.add_subcommand(
      "train-tokenizer", "Train a byte-level BPE tokenizer and write a HF tokenizer.json");
  cmd->add_option("--corpus", args->corpus, "UTF-8 text file to train on")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--vocab-size", args->vocab_size,
                  "Total ids: 256 bytes + merges + special tokens")
      ->capture_default_str();
  cmd->add_option("--out", args->out, "Path of the tokenizer.json to write")->required();
  cmd->add_option("--special", args->specials, "Special (added) tokens, in id order")
      ->capture_default_str();
  cmd->callback([args] { vtoken::cli::SetExitCode(RunTrainTokenizer(*args)); });
  return cmd;
}

}  // namespace

VTOKEN_REGISTER_COMMAND("train-tokenizer", SetupTrainTokenizer);
