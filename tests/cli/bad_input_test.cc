// Bad input to vtoken-cli, one case per test: each exits 1 or 2 with exactly one stderr line
// that names the file, key or flag at fault, and leaves the result database without a partial
// run (no database at all, or only runs that completed or that hold no rows). Plus SIGINT /
// SIGTERM during a run and a full disk (tmpfs, root only). Cases use the sim: backend or tiny
// workloads on models/vt-tiny, so the whole suite takes seconds.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "lib/model/io/checkpoint.h"
#include "lib/model/io/gguf.h"
#include "lib/model/io/tokenizer.h"
#include "tests/cli/cli_test_util.h"
#include "tests/model/gguf_test_writer.h"

extern char** environ;

namespace vtoken::cli {
namespace {

namespace fs = std::filesystem;

// A small sim: experiment (no weights): runs in well under a second.
const char* kSimConfig = R"(name = "bad"
modes = ["native", "vtoken"]
[model]
path = "sim:llama-3.1-8b"
[workload]
num_requests = 4
[policy]
budget_tokens = 64
)";

// The bundled model on a tiny long-prompt workload drawn from corpus.txt.
std::string TinyConfig(const std::string& model, const std::string& corpus) {
  return "name = \"tiny\"\nmodes = [\"native\", \"vtoken\"]\n[model]\npath = \"" + model +
         "\"\n[workload]\nkind = \"longbench_like\"\nnum_requests = 2\ninput_min = 20\n"
         "input_max = 30\noutput_min = 4\noutput_max = 4\ncorpus = \"" +
         corpus +
         "\"\n[engine]\nnum_blocks = 64\n[policy]\nkeep_ratio = 0.5\nnum_sink = 2\n"
         "num_recent = 4\n";
}

const char* kCorpus =
    "In the beginning God created the heaven and the earth.\n"
    "And the earth was without form, and void; and darkness was upon the face of the deep.\n"
    "And the Spirit of God moved upon the face of the waters.\n"
    "And God said, Let there be light: and there was light.\n";

struct Case {
  std::string name;
  // "{dir}" is replaced by the test's scratch directory, "{src}" by the source tree.
  std::vector<std::string> args;
  std::string message;  // A substring of the one stderr line.
  // Files the case needs (they see the same substitutions), written before it runs.
  std::function<void(const std::string& dir)> setup = nullptr;
};

void Write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

std::string Sub(std::string s, const std::string& dir) {
  for (const auto& [key, value] :
       {std::pair<std::string, std::string>{"{dir}", dir}, {"{src}", SourceDir()}}) {
    for (size_t at; (at = s.find(key)) != std::string::npos;) s.replace(at, key.size(), value);
  }
  return s;
}

// A model directory like vt-tiny with its weights linked, not copied.
void LinkTiny(const std::string& dir) {
  fs::create_directories(dir);
  for (const char* f : {"config.json", "tokenizer.json", "model.safetensors"}) {
    fs::create_symlink(fs::absolute(SourceDir() + "/models/vt-tiny/" + f), dir + "/" + f);
  }
}

// Removes `name` from the header of a safetensors file, keeping its bytes (padded header).
void DropFromHeader(const std::string& from, const std::string& to, const std::string& name) {
  std::ifstream in(from, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(bytes[i]);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  header.erase(name);
  std::string text = header.dump();
  text.resize(n, ' ');
  bytes.replace(8, n, text);
  std::ofstream(to, std::ios::binary) << bytes;
}

// vt-tiny as a GGUF file at `path` (F32, with its tokenizer), its metadata and tensors passed
// through `edit` first.
void TinyGguf(const std::string& path,
              const std::function<void(model::GgufMetadata&,
                                       std::vector<model::GgufTensorToWrite>&)>& edit = nullptr) {
  StatusOr<model::Checkpoint> c = model::LoadCheckpoint(SourceDir() + "/models/vt-tiny");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  StatusOr<model::Tokenizer> t =
      model::Tokenizer::Load(SourceDir() + "/models/vt-tiny/tokenizer.json");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  fs::create_directories(fs::path(path).parent_path());
  const std::string plain = path + ".plain";
  ASSERT_EQ(model::testing::WriteLlamaGguf(*c, plain, model::GgmlType::kF32,
                                           model::testing::TokenizerMetadata(*t)),
            "");
  if (edit == nullptr) {
    fs::rename(plain, path);
    return;
  }
  StatusOr<model::GgufFile> file = model::GgufFile::Open(plain);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  model::GgufMetadata metadata = file->metadata();
  std::vector<model::GgufTensorToWrite> tensors;
  for (const model::GgufTensor& g : file->tensors()) {
    tensors.push_back({g.name, g.type, g.dims, g.bytes});
  }
  edit(metadata, tensors);
  ASSERT_TRUE(model::WriteGguf(path, metadata, tensors).ok());
  fs::remove(plain);
}

// Overwrites `bytes` at `offset` of the file (the first `at` occurrence of `after` plus
// `offset` when `after` is given).
void Patch(const std::string& path, const std::string& after, int64_t offset,
           const std::string& bytes) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  std::string head(1 << 20, '\0');
  f.read(head.data(), static_cast<std::streamsize>(head.size()));
  const size_t at = after.empty() ? 0 : head.find(after) + after.size();
  f.clear();
  f.seekp(static_cast<std::streamoff>(at + offset));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string Le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

std::vector<std::string> Run(const std::string& config, std::vector<std::string> more) {
  std::vector<std::string> args = {"run", config, "--db", "{dir}/r.db"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}
std::vector<std::string> Sim(std::vector<std::string> sets) {
  std::vector<std::string> more;
  for (std::string& s : sets) {
    more.push_back("--set");
    more.push_back(std::move(s));
  }
  return Run("{dir}/sim.toml", more);
}
std::vector<std::string> Tiny(std::vector<std::string> sets) {
  std::vector<std::string> more;
  for (std::string& s : sets) {
    more.push_back("--set");
    more.push_back(std::move(s));
  }
  return Run("{dir}/tiny.toml", more);
}
std::vector<std::string> Jsonl(const std::string& lines) {
  (void)lines;
  return Tiny({"workload.kind='jsonl'", "workload.jsonl='{dir}/w.jsonl'", "workload.corpus=''"});
}
auto WriteJsonl(const std::string& lines) {
  return [lines](const std::string& dir) { Write(dir + "/w.jsonl", lines); };
}
std::vector<std::string> Gen(std::vector<std::string> more) {
  std::vector<std::string> args = {"generate", "--model", "{src}/models/vt-tiny", "--prompt",
                                   "And God said"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}
const char* kGrid = "\n[sweep.grid]\n\"engine.max_num_seqs\" = [1, 2, 3, 4]\n";

std::vector<Case> Cases() {
  const std::string big = "9223372036854775807";
  return {
      // Config files.
      {"MalformedToml", Run("{dir}/m.toml", {}), "m.toml:2",
       [](const std::string& d) { Write(d + "/m.toml", "name = \"x\"\n[engine\n"); }},
      {"ConfigIsADirectory", Run("{dir}", {}), "is not a regular file"},
      {"ConfigMissing", Run("{dir}/absent.toml", {}), "absent.toml not found"},
      {"UnknownKey", Sim({"engine.num_blockz=3"}), "unknown key 'engine.num_blockz'"},
      {"WrongType", Sim({"engine.num_blocks='many'"}),
       "key 'engine.num_blocks' must be an integer"},
      {"Int32OutOfRange", Sim({"engine.num_blocks=2147483648"}),
       "key 'engine.num_blocks' is out of range"},
      {"KvStoreTooBig", Sim({"engine.num_blocks=2147483647"}),
       "key 'engine.num_blocks' = 2147483647 x engine.block_size 16 = 34359738352 slots, more than "
       "the 1073741824 a pool can hold"},
      {"KvStoreTooBigForMemory", Tiny({"engine.num_blocks=60000000"}),
       "engine.num_blocks = 60000000: the KV store"},
      {"WorkloadTooBig", Sim({"workload.num_requests=100000000"}),
       "workload.num_requests = 100000000: the requests"},
      {"OutputLengthOverflow",
       Sim({"workload.kind='longbench_like'", "workload.output_min=" + big,
            "workload.output_max=" + big}),
       "key 'workload.output_min' = 9223372036854775807: must be <= 2147483647"},
      {"InputLengthOverflow", Sim({"workload.kind='longbench_like'", "workload.input_max=" + big}),
       "key 'workload.input_max' = 9223372036854775807: must be <= 2147483647"},
      {"TotalTokensOverflow", Sim({"workload.max_total_tokens=" + big}),
       "key 'workload.max_total_tokens' = 9223372036854775807"},
      {"TemperatureNan", Sim({"sampling.temperature=nan"}),
       "key 'sampling.temperature' must be a finite number >= 0"},
      {"TemperatureNegative", Sim({"sampling.temperature=-1"}), "key 'sampling.temperature'"},
      {"TopPAboveOne", Sim({"sampling.top_p=5"}), "key 'sampling.top_p' must be in (0, 1]"},
      {"TopPZero", Sim({"sampling.top_p=0"}), "key 'sampling.top_p' must be in (0, 1]"},
      {"RecentBeyondContext", Tiny({"policy.num_recent=100000"}),
       "key 'policy.num_recent' = 100000 exceeds the model's context (1024"},
      {"SinkBeyondContext", Tiny({"policy.num_sink=5000"}),
       "key 'policy.num_sink' = 5000 exceeds the model's context"},
      {"BudgetBeyondContext", Tiny({"policy.budget_tokens=2000", "policy.keep_ratio=0"}),
       "key 'policy.budget_tokens' = 2000 exceeds the model's context (1024"},
      {"SinkOverflow", Sim({"policy.num_sink=3000000000"}),
       "key 'policy.num_sink' must be in [0, 2147483647] (is 3000000000)"},
      {"BatchedTokensOverflow", Sim({"engine.max_batched_tokens=" + big}),
       "key 'engine.max_batched_tokens' must be <= 2147483647"},
      {"KeepRatioAboveOne", Sim({"policy.keep_ratio=1.5"}), "keep_ratio"},
      {"BudgetAndKeepRatio", Sim({"policy.keep_ratio=0.5"}), "policy.keep_ratio are exclusive"},
      {"UnknownPolicy", Sim({"policy.name='nope'"}), "unknown policy"},
      {"UnknownTokenSignal", Tiny({"policy.name='layer_union'", "policy.params.signal='nope'"}),
       "policy layer_union reads unknown token signal 'nope' (registered: "},
      {"UnknownTokenSignalView",
       Tiny({"policy.name='layer_union'", "policy.params.signal='value_norm@row'"}),
       "unknown token signal view 'value_norm@row@layer' (views: value_norm@layer, "
       "value_norm@head)"},
      {"PolicyParamTypo", Run("{dir}/pp.toml", {}),
       "pp.toml:10: key 'policy.params.recnt_ratio': policy 'h2o' has no parameter 'recnt_ratio' "
       "(known: recent_ratio); did you mean 'recent_ratio'?",
       [](const std::string& d) {
         Write(d + "/pp.toml", std::string(kSimConfig) + "[policy.params]\nrecnt_ratio = 0.5\n");
       }},
      {"PolicyParamOutOfRange", Sim({"policy.params.recent_ratio=3"}),
       "sim.toml (--set policy.params.recent_ratio=3): key 'policy.params.recent_ratio': policy "
       "'h2o': parameter 'recent_ratio' = 3 is outside [0, 1]"},
      {"OtherPolicysParamTable", Run("{dir}/pt.toml", {}),
       "pt.toml:10: key 'policy.params.decayed_attention.decy': policy 'decayed_attention' has no "
       "parameter 'decy'",
       [](const std::string& d) {
         Write(d + "/pt.toml",
               std::string(kSimConfig) + "[policy.params.decayed_attention]\ndecy = 0.5\n");
       }},
      {"DuplicateGridValue", Run("{dir}/dup.toml", {}),
       "key 'sweep.grid.\"engine.max_num_seqs\"' lists 4 twice",
       [](const std::string& d) {
         Write(d + "/dup.toml",
               std::string(kSimConfig) + "[sweep.grid]\n\"engine.max_num_seqs\" = [4, 8, 4]\n");
       }},
      {"DuplicateSeed", Run("{dir}/seeds.toml", {}), "key 'sweep.seeds' lists 2 twice",
       [](const std::string& d) {
         Write(d + "/seeds.toml", std::string(kSimConfig) + "[sweep]\nseeds = [1, 2, 2]\n");
       }},
      {"NegativeSeed", Run("{dir}/neg.toml", {}), "key 'sweep.seeds' must list integers >= 0",
       [](const std::string& d) {
         Write(d + "/neg.toml", std::string(kSimConfig) + "[sweep]\nseeds = [1, -2]\n");
       }},
      {"SeedsAndASeedAxis", Run("{dir}/both.toml", {}),
       "key 'sweep.seeds' cannot be combined with a [sweep.grid] axis \"seed\"",
       [](const std::string& d) {
         Write(d + "/both.toml",
               std::string(kSimConfig) + "[sweep]\nseeds = [1, 2]\n[sweep.grid]\nseed = [3, 4]\n");
       }},
      {"ExcludeNotAnAxis", Run("{dir}/ex1.toml", {}),
       "[[sweep.exclude]] entry 1: key 'engine.num_blocks' is not a [sweep.grid] axis (axes: "
       "engine.max_num_seqs)",
       [](const std::string& d) {
         Write(d + "/ex1.toml",
               std::string(kSimConfig) + kGrid + "[[sweep.exclude]]\n\"engine.num_blocks\" = 4\n");
       }},
      {"ExcludeValueNotInTheAxis", Run("{dir}/ex2.toml", {}),
       "[[sweep.exclude]] entry 1: 7 is not a value of axis 'engine.max_num_seqs'",
       [](const std::string& d) {
         Write(d + "/ex2.toml", std::string(kSimConfig) + kGrid +
                                    "[[sweep.exclude]]\n\"engine.max_num_seqs\" = 7\n");
       }},
      {"ExcludeEveryPoint", Run("{dir}/ex3.toml", {}), "[sweep] has no point left",
       [](const std::string& d) {
         std::string text = std::string(kSimConfig) + kGrid;
         for (int v = 1; v <= 4; ++v) {
           text += "[[sweep.exclude]]\n\"engine.max_num_seqs\" = " + std::to_string(v) + "\n";
         }
         Write(d + "/ex3.toml", text);
       }},
      {"ExcludeNotATableArray", Run("{dir}/ex4.toml", {}),
       "key 'sweep.exclude' must be a non-empty array of tables ([[sweep.exclude]])",
       [](const std::string& d) {
         Write(d + "/ex4.toml", std::string(kSimConfig) + "[sweep]\nexclude = 3\n");
       }},
      {"AddRepeatsAPoint", Run("{dir}/add1.toml", {}),
       "[[sweep.add]] lists a point the sweep already has (engine.max_num_seqs=2)",
       [](const std::string& d) {
         Write(d + "/add1.toml",
               std::string(kSimConfig) + kGrid + "[[sweep.add]]\n\"engine.max_num_seqs\" = 2\n");
       }},
      {"AddSetsASeedTheSeedsRepeat", Run("{dir}/add2.toml", {}),
       "[[sweep.add]] entry 1: key 'workload.seed' is repeated by [sweep] seeds",
       [](const std::string& d) {
         Write(d + "/add2.toml",
               std::string(kSimConfig) +
                   "[sweep]\nseeds = [1, 2]\n[[sweep.add]]\n\"workload.seed\" = 3\n");
       }},
      {"GranularityUnknown", Sim({"cache.granularity='row'"}),
       "key 'cache.granularity' must be \"token\", \"layer\" or \"head\""},
      {"PyramidAtTokenGranularity", Sim({"policy.budget_allocation='pyramid'"}),
       "needs cache.granularity \"layer\" or \"head\""},
      {"JsonlOnASyntheticKind", Sim({"workload.jsonl='x.jsonl'"}),
       "key 'workload.jsonl' = x.jsonl: is read only by kind jsonl"},
      {"PrefixDegreeThree", Sim({"workload.prefix_sharing_degree=3"}),
       "key 'workload.prefix_sharing_degree' = 3: must be 1, 2, 4 or 8"},
      {"JsonlWithoutFile", Sim({"workload.kind='jsonl'"}), "jsonl_path"},
      {"UnknownKind", Sim({"workload.kind='nope'"}), "key 'workload.kind' = nope"},
      {"LengthSigmaHuge", Sim({"workload.length_sigma=50"}),
       "key 'workload.length_sigma' = 50: must be in [0, 10]"},
      {"PoissonRateZero", Sim({"workload.arrival='poisson'", "workload.rate=0"}),
       "key 'workload.rate' = 0"},
      {"WorkloadBoundsOnTheirLine", Run("{dir}/w.toml", {}),
       "w.toml:8: key 'workload.input_max' = 50: must be >= input_min",
       [](const std::string& d) {
         Write(d + "/w.toml",
               "name = \"bad\"\nmodes = [\"native\"]\n[model]\npath = \"sim:llama-3.1-8b\"\n"
               "[workload]\nkind = \"longbench_like\"\ninput_min = 100\ninput_max = 50\n");
       }},
      {"BlockSizeZero", Sim({"engine.block_size=0"}), "block_size"},
      {"UnknownAdmission", Sim({"engine.admission='fifo'"}), "key 'engine.admission' must be"},
      {"UnknownTrigger", Sim({"reclaim.trigger='sometimes'"}), "key 'reclaim.trigger' must be"},
      {"FragThresholdTwo", Sim({"reclaim.frag_threshold=2"}), "frag_threshold"},
      {"ModeTwice", Sim({"modes=['native', 'native']"}), "names mode native twice"},
      {"UnknownMode", Sim({"modes=['fast']"}), "key 'modes'"},
      {"SimTableOnARealModel", Tiny({"sim.seed=1"}), "table [sim] needs a sim: model"},
      {"SetWithoutEquals", Sim({"engine.num_blocks"}),
       "--set 'engine.num_blocks': expected key=value"},
      {"SetThroughAValue", Sim({"model.path.x=1"}), "--set model.path.x: 'path' in"},
      {"GpuUtilizationOnARealModel", Tiny({"engine.gpu_memory_utilization=0.9"}),
       "gpu_memory_utilization"},
      {"CudaGraphsOnTheCpu", Tiny({"engine.cuda_graphs=true"}),
       "key 'engine.cuda_graphs' needs model.device = \"cuda\""},
      // GGUF files (vt-tiny converted by the tests' writer, then broken).
      {"GgufTruncated", Tiny({"model.path='{dir}/m.gguf'"}), "m.gguf",
       [](const std::string& d) {
         TinyGguf(d + "/m.gguf");
         fs::resize_file(d + "/m.gguf", 1000);
       }},
      {"GgufWrongMagic", Tiny({"model.path='{dir}/m.gguf'"}), "magic",
       [](const std::string& d) {
         TinyGguf(d + "/m.gguf");
         Patch(d + "/m.gguf", "", 0, "GGML");
       }},
      {"GgufVersion1", Tiny({"model.path='{dir}/m.gguf'"}), "GGUF version 1 is not supported",
       [](const std::string& d) {
         TinyGguf(d + "/m.gguf");
         Patch(d + "/m.gguf", "", 4, std::string("\x01\0\0\0", 4));
       }},
      {"GgufTensorCountBeyondFile", Tiny({"model.path='{dir}/m.gguf'"}), "tensor count",
       [](const std::string& d) {
         TinyGguf(d + "/m.gguf");
         Patch(d + "/m.gguf", "", 8, Le64(1ull << 40));
       }},
      {"GgufMetadataCountBeyondFile", Tiny({"model.path='{dir}/m.gguf'"}), "metadata count",
       [](const std::string& d) {
         TinyGguf(d + "/m.gguf");
         Patch(d + "/m.gguf", "", 16, Le64(1ull << 40));
       }},
      {"GgufStringPastTheEnd", Tiny({"model.path='{dir}/m.gguf'"}), "key",
       [](const std::string& d) {
         TinyGguf(d + "/m.gguf");
         Patch(d + "/m.gguf", "", 24, Le64(1ull << 50));
       }},
      {"GgufUnknownType", Tiny({"model.path='{dir}/m.gguf'"}), "unknown ggml type 31",
       [](const std::string& d) {
         TinyGguf(d + "/m.gguf");
         // After the name: n_dims (4 bytes), two dims (16), then the type.
         Patch(d + "/m.gguf", "token_embd.weight", 20, std::string("\x1f\0\0\0", 4));
       }},
      {"GgufMisalignedData", Tiny({"model.path='{dir}/m.gguf'"}), "not a multiple of the alignment",
       [](const std::string& d) {
         TinyGguf(d + "/m.gguf");
         Patch(d + "/m.gguf", "token_embd.weight", 24, Le64(1));
       }},
      {"GgufDataPastTheEnd", Tiny({"model.path='{dir}/m.gguf'"}), "runs past the end of the file",
       [](const std::string& d) {
         TinyGguf(d + "/m.gguf");
         fs::resize_file(d + "/m.gguf", fs::file_size(d + "/m.gguf") - 64);
       }},
      {"GgufMissingTensor", Tiny({"model.path='{dir}/m.gguf'"}),
       "tensor output_norm.weight (model.norm.weight) is missing",
       [](const std::string& d) {
         TinyGguf(d + "/m.gguf", [](auto&, auto& tensors) {
           std::erase_if(tensors, [](const auto& t) { return t.name == "output_norm.weight"; });
         });
       }},
      {"GgufShapeDisagrees", Tiny({"model.path='{dir}/m.gguf'"}),
       "tensor blk.0.ffn_gate.weight has shape [512, 192] (row-major), the metadata implies [640, "
       "192]",
       [](const std::string& d) {
         TinyGguf(d + "/m.gguf", [](auto& m, auto&) {
           m.Set("llama.feed_forward_length", model::GgufValue::Uint32(640));
         });
       }},
      {"GgufArchitecture", Tiny({"model.path='{dir}/m.gguf'"}),
       "architecture 'gptneox' is not supported",
       [](const std::string& d) {
         TinyGguf(d + "/m.gguf", [](auto& m, auto&) {
           m.Set("general.architecture", model::GgufValue::String("gptneox"));
         });
       }},
      {"GgufVocabularyDisagrees", Tiny({"model.path='{dir}/m.gguf'"}),
       "token_embd.weight has 2048 rows",
       [](const std::string& d) {
         TinyGguf(d + "/m.gguf", [](auto& m, auto&) {
           std::vector<std::string> tokens = m.GetStringArray("tokenizer.ggml.tokens").value();
           std::vector<int64_t> types = m.GetIntArray("tokenizer.ggml.token_type").value();
           tokens.push_back("extra");
           std::vector<int32_t> types32(types.begin(), types.end());
           types32.push_back(1);
           m.Set("tokenizer.ggml.tokens", model::GgufValue::StringArray(tokens));
           m.Set("tokenizer.ggml.token_type", model::GgufValue::Int32Array(types32));
           m.Set("llama.vocab_size", model::GgufValue::Uint32(2049));
         });
       }},
      {"GgufUnknownPreTokenizer", Tiny({"model.path='{dir}/m.gguf'"}), "tekken",
       [](const std::string& d) {
         TinyGguf(d + "/m.gguf", [](auto& m, auto&) {
           m.Set("tokenizer.ggml.pre", model::GgufValue::String("tekken"));
         });
       }},
      {"GgufSentencePiece", Tiny({"model.path='{dir}/m.gguf'"}), "llama",
       [](const std::string& d) {
         TinyGguf(d + "/m.gguf", [](auto& m, auto&) {
           m.Set("tokenizer.ggml.model", model::GgufValue::String("llama"));
         });
       }},
      {"GgufChatWithoutTemplate", Tiny({"model.path='{dir}/m.gguf'", "workload.chat=true"}),
       "chat_template", [](const std::string& d) { TinyGguf(d + "/m.gguf"); }},
      {"GgufGenerateChatOtherTemplate",
       {"generate", "--model", "{dir}/m.gguf", "--prompt", "hi", "--chat"},
       "{% for m in messages %}{{ m.content }}",
       [](const std::string& d) {
         TinyGguf(d + "/m.gguf", [](auto& m, auto&) {
           m.Set("tokenizer.chat_template",
                 model::GgufValue::String(
                     "{% for m in messages %}{{ m.content }}{% endfor %}\nmore"));
         });
       }},
      {"UnknownShortName", Tiny({"model.path='no-such-model'"}),
       "model no-such-model not found: not a file, a directory or a known model name (known: "
       "smollm2-135m)"},
      // Model directories.
      {"ModelMissing", Tiny({"model.path='{dir}/none'"}), "/none"},
      {"TruncatedWeights", Tiny({"model.path='{dir}/m'"}), "model.safetensors",
       [](const std::string& d) {
         fs::create_directories(d + "/m");
         for (const char* f : {"config.json", "tokenizer.json"}) {
           fs::copy(SourceDir() + "/models/vt-tiny/" + f, d + "/m/" + f);
         }
         std::ifstream in(SourceDir() + "/models/vt-tiny/model.safetensors", std::ios::binary);
         std::string head(1000, 0);
         in.read(head.data(), 1000);
         Write(d + "/m/model.safetensors", head);
       }},
      {"NoConfigJson", Tiny({"model.path='{dir}/m'"}), "config.json",
       [](const std::string& d) {
         LinkTiny(d + "/m");
         fs::remove(d + "/m/config.json");
       }},
      {"ConfigJsonNotJson", Tiny({"model.path='{dir}/m'"}), "config.json",
       [](const std::string& d) {
         LinkTiny(d + "/m");
         fs::remove(d + "/m/config.json");
         Write(d + "/m/config.json", "{ not json");
       }},
      {"UnknownModelType", Tiny({"model.path='{dir}/m'"}), "model_type",
       [](const std::string& d) {
         LinkTiny(d + "/m");
         std::ifstream in(SourceDir() + "/models/vt-tiny/config.json");
         nlohmann::json j = nlohmann::json::parse(in);
         j["model_type"] = "gpt_neox";
         fs::remove(d + "/m/config.json");
         Write(d + "/m/config.json", j.dump());
       }},
      {"CorruptTokenizer", Tiny({"model.path='{dir}/m'"}), "tokenizer.json",
       [](const std::string& d) {
         LinkTiny(d + "/m");
         fs::remove(d + "/m/tokenizer.json");
         Write(d + "/m/tokenizer.json", "{\"model\": 3}");
       }},
      {"TensorLeftOutOfHeader", Tiny({"model.path='{dir}/m'"}),
       "required tensor 'model.norm.weight' is missing",
       [](const std::string& d) {
         LinkTiny(d + "/m");
         fs::remove(d + "/m/model.safetensors");
         DropFromHeader(SourceDir() + "/models/vt-tiny/model.safetensors",
                        d + "/m/model.safetensors", "model.norm.weight");
       }},
      // Corpora and JSONL workloads.
      {"BinaryCorpus", Tiny({"workload.corpus='{dir}/bin.dat'"}), "bin.dat is not UTF-8 text",
       [](const std::string& d) {
         Write(d + "/bin.dat", std::string("\x7f"
                                           "ELF\x02\x01\x01\x00\x00\nxx\n",
                                           14));
       }},
      {"CorpusMissing", Tiny({"workload.corpus='{dir}/none.txt'"}),
       "corpus file {dir}/none.txt not found"},
      {"JsonlNotJson", Jsonl(""), "w.jsonl:2: not valid JSON",
       WriteJsonl("{\"prompt\": \"a\"}\n{oops\n")},
      {"JsonlMaxTokensOverflow", Jsonl(""),
       "w.jsonl:1: \"max_tokens\" must be an integer in [1, 2147483647]",
       WriteJsonl("{\"prompt\": \"a\", \"max_tokens\": 9223372036854775807}\n")},
      {"JsonlMaxTokensZero", Jsonl(""), "w.jsonl:1: \"max_tokens\" must be an integer in [1",
       WriteJsonl("{\"prompt\": \"a\", \"max_tokens\": 0}\n")},
      {"JsonlNoPrompt", Jsonl(""), "w.jsonl:1: needs a string \"prompt\"",
       WriteJsonl("{\"text\": \"a\"}\n")},
      {"JsonlEmpty", Jsonl(""), "w.jsonl holds no requests", WriteJsonl("\n\n")},
      {"JsonlBeyondContext", Jsonl(""), "the model's context is 1024",
       WriteJsonl("{\"prompt\": \"And God said\", \"max_tokens\": 5000}\n")},
      {"JsonlNotAnObject", Jsonl(""), "w.jsonl: element 0: expected a JSON object",
       WriteJsonl("[1, 2]\n")},
      // Sweeps.
      {"SweepWithoutSweepTable",
       {"sweep", "{dir}/sim.toml", "--db", "{dir}/r.db"},
       "has no [sweep] table"},
      {"ShardBeyondGrid",
       {"sweep", "{dir}/grid.toml", "--shard", "7/10", "--db", "{dir}/r.db"},
       "--shard 7/10: the grid has 4 point(s), so shard 7 would run none"},
      {"ShardMalformed",
       {"sweep", "{dir}/grid.toml", "--shard", "3/2", "--db", "{dir}/r.db"},
       "need 0 <= I < N"},
      {"JobsTooMany",
       {"sweep", "{dir}/grid.toml", "--jobs", "100000", "--db", "{dir}/r.db"},
       "--jobs must be in [1, 256], got 100000"},
      {"JobsZero",
       {"sweep", "{dir}/grid.toml", "--jobs", "0", "--db", "{dir}/r.db"},
       "--jobs must be in [1, 256], got 0"},
      // Flags.
      {"UnknownCommand", {"frobnicate"}, "unknown command 'frobnicate' (commands: check"},
      {"UnknownFlag", {"check", "--bogus-flag"}, "bogus-flag"},
      {"CheckBlocksZero",
       {"check", "--num-blocks", "0"},
       "--num-blocks: must be an integer >= 1, got 0"},
      {"CheckBlocksHuge",
       {"check", "--num-blocks", "2000000000"},
       "the host KV store (--num-blocks 2000000000"},
      {"CheckBytesPerTokenHuge",
       {"check", "--bytes-per-token", "2000000000"},
       "--bytes-per-token 2000000000) needs"},
      {"CheckRequestsWithoutModel", {"check", "--requests", "3"}, "--requests needs --model"},
      {"CheckBlockSizeHuge",
       {"check", "--block-size", "5000"},
       "--block-size: must be an integer in [1, 4096], got 5000"},
      {"CheckStepsNotANumber",
       {"check", "--steps", "ten"},
       "--steps: must be an integer >= 0, got 'ten'"},
      {"GenerateTemperatureNan", Gen({"--temperature", "nan"}),
       "--temperature: must be a finite number >= 0 (0 = greedy), got nan"},
      {"GenerateTopP", Gen({"--top-p", "5"}), "--top-p: must be a number in (0, 1], got 5"},
      {"GenerateRecentNegative",
       Gen({"--policy", "h2o", "--budget-tokens", "8", "--num-recent", "-5"}),
       "--num-recent: must be an integer in [0"},
      {"GenerateMaxTokensHuge", Gen({"--max-tokens", "99999999999"}),
       "--max-tokens: must be an integer in [1, 2147483647]"},
      {"GenerateBeyondContext", Gen({"--max-tokens", "5000"}),
       "--max-tokens 5000: the prompt's 5 positions"},
      {"GenerateDropTwice", Gen({"--drop", "1,1"}), "--drop lists 1 twice"},
      {"GenerateDropBeyondPrompt", Gen({"--drop", "9999"}),
       "--drop 9999: the prompt has positions 0..4"},
      {"GenerateDropMalformed", Gen({"--drop", "1,x"}),
       "--drop '1,x': expected comma-separated positions"},
      {"GenerateDropWithPolicy", Gen({"--drop", "1", "--policy", "h2o", "--budget-tokens", "4"}),
       "--drop chooses the evicted tokens itself"},
      {"GenerateOutputYaml", Gen({"--output", "yaml"}), "--output: yaml not in {text,ids,json}"},
      {"GeneratePolicyParamAlone", Gen({"--policy-param", "x=1"}), "--policy-param needs --policy"},
      {"GenerateUnknownPolicyParam",
       Gen({"--policy", "h2o", "--budget-tokens", "4", "--policy-param", "nope=1"}),
       "policy 'h2o' has no parameter 'nope'"},
      {"GenerateDeviceUnknown", Gen({"--device", "tpu"}),
       "--device: must be \"cpu\", \"cuda\" or \"cuda:N\", got tpu"},
      {"GenerateDeviceIndexMalformed", Gen({"--device", "cuda:x"}), "--device: must be \"cpu\""},
      {"GenerateDtypeUnknown", Gen({"--dtype", "int8"}),
       "--dtype: must be \"float32\", \"bfloat16\" or \"float16\", got int8"},
      {"GenerateGranularityUnknown", Gen({"--granularity", "row"}),
       "--granularity: must be \"token\", \"layer\" or \"head\", got row"},
      {"GenerateThreadsNegative", Gen({"--threads", "-1"}),
       "--threads: must be 0 (every CPU this process may use) to 1024, got -1"},
      {"CheckDeviceWithoutModel", {"check", "--device", "cuda"}, "--device needs --model"},
      {"CheckDtypeWithoutModel", {"check", "--dtype", "bfloat16"}, "--dtype needs --model"},
      {"CheckModelDtypeUnknown",
       {"check", "--model", "{src}/models/vt-tiny", "--dtype", "fp8"},
       "--dtype \"fp8\": must be"},
      {"CheckModelGranularityUnknown",
       {"check", "--model", "{src}/models/vt-tiny", "--granularity", "row"},
       "--granularity: must be \"token\", \"layer\" or \"head\", got row"},
      {"ConfigDeviceIndexMalformed", Tiny({"model.device='cuda:one'"}),
       "key 'model.device' must be \"cpu\", \"cuda\" or \"cuda:N\""},
      {"ConfigDtypeUnknown", Tiny({"model.dtype='fp8'"}),
       "key 'model.dtype' must be \"float32\", \"bfloat16\" or \"float16\""},
      {"ConfigThreadsNegative", Tiny({"model.threads=-2"}),
       "key 'model.threads' must be 0 (every CPU this process may use) to 1024"},
      {"EmptyDb", {"run", "{dir}/sim.toml", "--db", ""}, "--db must name a database file, got ''"},
      {"RunsLastZero",
       {"runs", "--db", "{dir}/r.db", "--last", "0"},
       "--last: must be an integer >= 1, got 0"},
      // Databases.
      {"CompareAbsentDb",
       {"compare", "--db", "{dir}/r.db", "--last", "2"},
       "result db {dir}/r.db not found"},
      {"RunsNotADatabase",
       {"runs", "--db", "{dir}/r.db"},
       "{dir}/r.db: PRAGMA user_version: file is not a database",
       [](const std::string& d) { Write(d + "/r.db", std::string(4096, 'x')); }},
      {"MergeCorruptSourceNamesIt",
       {"merge", "{dir}/corrupt.db", "--into", "{dir}/r.db"},
       "result db {dir}/corrupt.db: ",
       [](const std::string& d) { Write(d + "/corrupt.db", std::string(4096, 'x')); }},
      {"ReportOutIsAFile",
       {"report", "--db", "{dir}/r.db", "--sweep", "s", "--out", "{dir}/file"},
       "--out {dir}/file is a file, not a directory",
       [](const std::string& d) { Write(d + "/file", "x"); }},
      {"DbUnderAFile",
       {"run", "{dir}/sim.toml", "--db", "{dir}/file/r.db"},
       "cannot create directory {dir}/file",
       [](const std::string& d) { Write(d + "/file", "x"); }},
  };
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class BadInputTest : public CliTest, public ::testing::WithParamInterface<Case> {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    if (!VTOKEN_CLI_HAS_TORCH) GTEST_SKIP() << "run and generate need a vtoken-cli with libtorch";
    Write(Path("sim.toml"), kSimConfig);
    Write(Path("grid.toml"), std::string(kSimConfig) + kGrid);
    Write(Path("corpus.txt"), kCorpus);
    Write(Path("tiny.toml"), TinyConfig(SourceDir() + "/models/vt-tiny", Path("corpus.txt")));
  }
};

// No run in `db` (if it exists) that did not complete holds rows.
void ExpectNoPartialRuns(const std::string& db) {
  if (!fs::exists(db)) return;
  StatusOr<engine::ResultStore> store = engine::ResultStore::OpenReadOnly(db);
  if (!store.ok()) return;  // Not a result database (the case wrote it): nothing of ours in it.
  StatusOr<std::vector<engine::RunRecord>> runs = store->ListRuns();
  ASSERT_TRUE(runs.ok()) << runs.status().ToString();
  for (const engine::RunRecord& r : *runs) {
    if (r.status == "completed") continue;
    EXPECT_TRUE(store->GetSteps(r.id)->empty()) << "run " << r.id << " is " << r.status;
    EXPECT_TRUE(store->GetRequests(r.id)->empty()) << "run " << r.id;
    EXPECT_TRUE(store->GetOutputs(r.id)->empty()) << "run " << r.id;
    EXPECT_TRUE(store->GetSummary(r.id)->values.empty()) << "run " << r.id;
  }
}

TEST_P(BadInputTest, OneLineErrorAndNoPartialRun) {
  const Case& c = GetParam();
  const std::string dir = dir_.string();
  if (c.setup) c.setup(dir);
  std::vector<std::string> args;
  for (const std::string& a : c.args) args.push_back(Sub(a, dir));
  const CliResult r = Cli(args);
  EXPECT_GE(r.exit_code, 1) << r.err;
  EXPECT_LE(r.exit_code, 2) << r.err;
  const std::vector<std::string> lines = Lines(r.err);
  ASSERT_EQ(lines.size(), 1u) << r.err;
  EXPECT_EQ(lines[0].rfind("vtoken-cli: error: ", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find(Sub(c.message, dir)), std::string::npos)
      << "expected: " << Sub(c.message, dir) << "\n     got: " << lines[0];
  ExpectNoPartialRuns(Path("r.db"));
}

INSTANTIATE_TEST_SUITE_P(Cases, BadInputTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// Starts `vtoken-cli ARGS...` with stdout / stderr into files; returns its pid.
pid_t Spawn(const std::vector<std::string>& args, const std::string& out, const std::string& err) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<std::string> all = {VTOKEN_CLI_PATH};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  EXPECT_EQ(posix_spawn(&pid, VTOKEN_CLI_PATH, &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

class RunSignalTest : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    if (!VTOKEN_CLI_HAS_TORCH) GTEST_SKIP() << "run needs a vtoken-cli with libtorch";
  }
  // Starts a sim run long enough to be signalled mid-way; returns once its run is 'running'.
  pid_t StartLongRun() {
    Write(Path("long.toml"), std::string(kSimConfig));
    const pid_t pid = Spawn({"run", Path("long.toml"), "--db", Path("r.db"), "--set",
                             "workload.num_requests=4000", "--set", "modes=['vtoken']"},
                            Path("out"), Path("err"));
    for (int i = 0; i < 600; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (!fs::exists(Path("r.db"))) continue;
      StatusOr<engine::ResultStore> store = engine::ResultStore::OpenReadOnly(Path("r.db"));
      if (!store.ok()) continue;
      StatusOr<std::vector<engine::RunRecord>> runs = store->ListRuns();
      if (runs.ok() && !runs->empty()) {
        // A few steps in: the engine loop is running.
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        return pid;
      }
    }
    ADD_FAILURE() << "the run never started: " << ReadFile(Path("err"));
    return pid;
  }
  int Wait(pid_t pid) {
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }
  engine::RunRecord OnlyRun() {
    StatusOr<engine::ResultStore> store = engine::ResultStore::Open(Path("r.db"));
    EXPECT_TRUE(store.ok());
    StatusOr<std::vector<engine::RunRecord>> runs = store->ListRuns();
    EXPECT_EQ(runs->size(), 1u);
    return runs->empty() ? engine::RunRecord{} : runs->front();
  }
};

TEST_F(RunSignalTest, SigintFinishesTheStepMarksTheRunInterruptedAndExits130) {
  const pid_t pid = StartLongRun();
  kill(pid, SIGINT);
  EXPECT_EQ(Wait(pid), 130) << ReadFile(Path("err"));
  const std::string err = ReadFile(Path("err"));
  EXPECT_NE(err.find("interrupted: finishing the current step"), std::string::npos) << err;
  EXPECT_NE(err.find("error: run 1 interrupted by SIGINT (stopped after step "), std::string::npos)
      << err;
  const engine::RunRecord run = OnlyRun();
  EXPECT_EQ(run.status, "interrupted");
  EXPECT_EQ(run.error.rfind("interrupted by SIGINT (stopped after step ", 0), 0u) << run.error;
  ExpectNoPartialRuns(Path("r.db"));
}

TEST_F(RunSignalTest, SigtermExits143) {
  const pid_t pid = StartLongRun();
  kill(pid, SIGTERM);
  EXPECT_EQ(Wait(pid), 143) << ReadFile(Path("err"));
  EXPECT_EQ(OnlyRun().status, "interrupted");
  ExpectNoPartialRuns(Path("r.db"));
}

TEST_F(RunSignalTest, SecondSignalExitsAtOnce) {
  const pid_t pid = StartLongRun();
  // Two different signals: two of the same kind may merge into one delivery. Threads may
  // take them in either order; the second one handled exits at once with its own code.
  kill(pid, SIGINT);
  kill(pid, SIGTERM);
  const int code = Wait(pid);
  EXPECT_TRUE(code == 130 || code == 143) << code;
  EXPECT_NE(ReadFile(Path("err")).find("second signal: exiting now"), std::string::npos);
  // The process died mid-step: the next writer marks its run interrupted; it holds no rows.
  EXPECT_EQ(OnlyRun().status, "interrupted");
  ExpectNoPartialRuns(Path("r.db"));
}

// `sweep --jobs 2`: SIGINT sent to the sweep's pid alone (not to its process group, as a terminal
// would) reaches its children only by forwarding; each finishes its step and marks its run
// interrupted, the sweep exits 130, and no run is left 'running' or holds rows without completing.
TEST_F(RunSignalTest, SweepWithJobsForwardsSigintToItsChildren) {
  Write(Path("grid.toml"), std::string(kSimConfig) +
                               "[sweep.grid]\n\"policy.name\" = [\"h2o\", "
                               "\"tova\", \"random\", \"snapkv\"]\n");
  const pid_t pid = Spawn({"sweep", Path("grid.toml"), "--db", Path("r.db"), "--jobs", "2", "--set",
                           "workload.num_requests=4000", "--set", "modes=['vtoken']"},
                          Path("out"), Path("err"));
  // Wait until both children have begun their runs.
  bool started = false;
  for (int i = 0; i < 600 && !started; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (!fs::exists(Path("r.db"))) continue;
    StatusOr<engine::ResultStore> store = engine::ResultStore::OpenReadOnly(Path("r.db"));
    if (!store.ok()) continue;
    StatusOr<std::vector<engine::RunRecord>> runs = store->ListRuns();
    started = runs.ok() && runs->size() >= 2;
  }
  ASSERT_TRUE(started) << ReadFile(Path("err"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(pid, SIGINT);
  EXPECT_EQ(Wait(pid), 130) << ReadFile(Path("err"));
  StatusOr<engine::ResultStore> store = engine::ResultStore::Open(Path("r.db"));
  ASSERT_TRUE(store.ok());
  StatusOr<std::vector<engine::RunRecord>> runs = store->ListRuns();
  ASSERT_TRUE(runs.ok());
  int interrupted = 0;
  for (const engine::RunRecord& r : *runs) {
    EXPECT_NE(r.status, "running") << "run " << r.id;
    interrupted += r.status == "interrupted" ? 1 : 0;
  }
  EXPECT_GE(interrupted, 1) << ReadFile(Path("err"));
  ExpectNoPartialRuns(Path("r.db"));
}

// A disk that fills up while the run's rows are written: the run is marked failed with the
// error and keeps none of its rows. Needs root (a tmpfs of 256 KiB).
TEST_F(CliTest, FullDiskFailsTheRunWithoutPartialRows) {
  if (!VTOKEN_CLI_HAS_TORCH) GTEST_SKIP() << "run needs a vtoken-cli with libtorch";
  if (geteuid() != 0) GTEST_SKIP() << "needs root to mount a tmpfs";
  const std::string mnt = Path("full");
  fs::create_directories(mnt);
  if (mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=256k") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  }
  struct Unmount {
    std::string path;
    ~Unmount() { umount(path.c_str()); }
  } unmount{mnt};
  Write(Path("sim.toml"), kSimConfig);
  const std::string db = mnt + "/r.db";
  // 300 requests: a few thousand step rows, more than 256 KiB.
  const CliResult r = Cli({"run", Path("sim.toml"), "--db", db, "--set",
                           "workload.num_requests=300", "--set", "modes=['vtoken']"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const std::vector<std::string> lines = Lines(r.err);
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines.back().find("database or disk is full"), std::string::npos) << r.err;
  {
    StatusOr<engine::ResultStore> store = engine::ResultStore::OpenReadOnly(db);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    StatusOr<std::vector<engine::RunRecord>> runs = store->ListRuns();
    ASSERT_EQ(runs->size(), 1u);
    EXPECT_EQ(runs->front().status, "failed");
    EXPECT_NE(runs->front().error.find("database or disk is full"), std::string::npos);
  }
  ExpectNoPartialRuns(db);
}

// The read-only commands read a database on a read-only file system (no WAL switch, no
// interrupted-marking write). Needs root (a tmpfs remounted read-only).
TEST_F(CliTest, ReadCommandsWorkOnAReadOnlyFileSystem) {
  if (!VTOKEN_CLI_HAS_TORCH) GTEST_SKIP() << "run needs a vtoken-cli with libtorch";
  if (geteuid() != 0) GTEST_SKIP() << "needs root to mount a tmpfs";
  const std::string mnt = Path("ro");
  fs::create_directories(mnt);
  if (mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=4m") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  }
  struct Unmount {
    std::string path;
    ~Unmount() { umount(path.c_str()); }
  } unmount{mnt};
  Write(Path("sim.toml"), kSimConfig);
  const std::string db = mnt + "/r.db";
  ASSERT_EQ(Cli({"run", Path("sim.toml"), "--db", db}).exit_code, 0);
  ASSERT_EQ(mount("tmpfs", mnt.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, "size=4m"), 0)
      << std::strerror(errno);
  const CliResult runs = Cli({"runs", "--db", db});
  EXPECT_EQ(runs.exit_code, 0) << runs.err;
  EXPECT_NE(runs.out.find("completed"), std::string::npos) << runs.out;
  const CliResult compare = Cli({"compare", "--db", db, "--last", "2"});
  EXPECT_EQ(compare.exit_code, 0) << compare.err;
  EXPECT_NE(compare.out.find("mode / policy"), std::string::npos) << compare.out;
}

}  // namespace
}  // namespace vtoken::cli
