// gguf_dequant_dump: the torch-free GGUF reader and dequantization, driven by
// scripts/check-gguf-dequant.py, which compares its output with gguf-py's.
//
//   gguf_dequant_dump FILE          per tensor in file order, a line "name\ttype\tN\n" and then N
//                                   little-endian float32s (N = 0 and the word "unsupported" for
//                                   a type DequantizeRow lacks); the time taken goes to stderr
//   gguf_dequant_dump --types       per ggml type id with a layout, "id\tname\tblock\tbytes"
//   gguf_dequant_dump --quantize TYPE
//                                   reads float32s from stdin, writes QuantizeRow's bytes
//   gguf_dequant_dump --f32 IN OUT  writes OUT: IN with every tensor dequantized to F32 and
//                                   general.file_type 0 (ALL_F32), metadata otherwise as in IN
//                                   (the F32 model of the llama.cpp comparison,
//                                   scripts/llama-cpp-compare.sh)
//   gguf_dequant_dump --bf16 IN OUT as --f32, but every tensor of two or more dimensions rounded
//                                   to BF16 (QuantizeRow: to nearest even), general.file_type 32
//                                   (MOSTLY_BF16): the BF16 model of that comparison
//   gguf_dequant_dump --from-dir DIR OUT
//                                   writes the model directory DIR (config.json, safetensors,
//                                   tokenizer.json) to OUT as an F32 llama GGUF with llama.cpp's
//                                   tokenizer metadata (tests/model/gguf_test_writer.h): vt-tiny
//                                   for llama.cpp (docs/PERFORMANCE.md's vt-tiny comparison)
//
// Exits 1 with the error on stderr when the file does not open or a call fails.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "lib/model/io/ggml_quants.h"
#include "lib/model/io/gguf.h"
#include "tests/model/gguf_test_writer.h"

namespace {

using vtoken::Status;
using vtoken::StatusOr;
using namespace vtoken::model;

int Fail(const std::string& what) {
  std::fprintf(stderr, "gguf_dequant_dump: %s\n", what.c_str());
  return 1;
}

int DumpTypes() {
  for (uint32_t id = 0; id < 256; ++id) {
    if (std::optional<GgmlTypeTraits> t = GgmlTypeInfo(id)) {
      std::printf("%u\t%s\t%lld\t%lld\n", id, t->name, static_cast<long long>(t->block_size),
                  static_cast<long long>(t->type_size));
    }
  }
  return 0;
}

int Quantize(const std::string& type_name) {
  std::optional<GgmlType> type;
  for (uint32_t id = 0; id < 256 && !type; ++id) {
    std::optional<GgmlTypeTraits> t = GgmlTypeInfo(id);
    if (t && type_name == t->name) type = static_cast<GgmlType>(id);
  }
  if (!type) return Fail("unknown ggml type " + type_name);
  const std::string in((std::istreambuf_iterator<char>(std::cin)), {});
  if (in.size() % sizeof(float) != 0) return Fail("stdin is not a whole number of float32s");
  std::vector<float> x(in.size() / sizeof(float));
  if (!x.empty()) std::memcpy(x.data(), in.data(), in.size());
  StatusOr<std::string> q = QuantizeRow(*type, x);
  if (!q.ok()) return Fail(q.status().ToString());
  std::fwrite(q->data(), 1, q->size(), stdout);
  return 0;
}

int Dump(const std::string& path) {
  StatusOr<GgufFile> file = GgufFile::Open(path);
  if (!file.ok()) return Fail(file.status().ToString());
  std::vector<float> out;
  double seconds = 0;
  int64_t elements = 0;
  for (const GgufTensor& t : file->tensors()) {
    const char* type = GgmlTypeInfo(static_cast<uint32_t>(t.type))->name;
    if (!CanDequantize(t.type)) {
      std::printf("%s\t%s\tunsupported\n", t.name.c_str(), type);
      continue;
    }
    out.resize(static_cast<size_t>(t.num_elements()));
    const auto start = std::chrono::steady_clock::now();
    Status s = DequantizeTensor(t, out);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!s.ok()) return Fail(s.ToString());
    elements += t.num_elements();
    std::printf("%s\t%s\t%zu\n", t.name.c_str(), type, out.size());
    std::fwrite(out.data(), sizeof(float), out.size(), stdout);
  }
  std::fprintf(stderr,
               "gguf_dequant_dump: %zu tensors, %lld elements dequantized in %.3f s (%.0f M/s)\n",
               file->tensors().size(), static_cast<long long>(elements), seconds,
               seconds > 0 ? static_cast<double>(elements) / seconds / 1e6 : 0.0);
  return std::fflush(stdout) == 0 ? 0 : Fail("write to stdout failed");
}

// --f32 (bf16 false) or --bf16.
int Convert(const std::string& in, const std::string& out, bool bf16) {
  StatusOr<GgufFile> file = GgufFile::Open(in);
  if (!file.ok()) return Fail(file.status().ToString());
  std::vector<std::vector<float>> data;
  std::vector<std::string> rounded;
  std::vector<GgufTensorToWrite> tensors;
  data.reserve(file->tensors().size());
  rounded.reserve(file->tensors().size());
  for (const GgufTensor& t : file->tensors()) {
    if (!CanDequantize(t.type)) {
      return Fail(in + ": tensor " + t.name + ": type " +
                  GgmlTypeInfo(static_cast<uint32_t>(t.type))->name + " cannot be dequantized");
    }
    data.emplace_back(static_cast<size_t>(t.num_elements()));
    if (Status s = DequantizeTensor(t, data.back()); !s.ok()) return Fail(s.ToString());
    if (bf16 && t.dims.size() >= 2) {
      StatusOr<std::string> bytes = QuantizeRow(GgmlType::kBF16, data.back());
      if (!bytes.ok()) return Fail(bytes.status().ToString());
      rounded.push_back(std::move(*bytes));
      tensors.push_back({t.name, GgmlType::kBF16, t.dims,
                         std::as_bytes(std::span(rounded.back().data(), rounded.back().size()))});
    } else {
      tensors.push_back({t.name, GgmlType::kF32, t.dims, std::as_bytes(std::span(data.back()))});
    }
  }
  GgufMetadata metadata = file->metadata();
  metadata.Set("general.file_type", GgufValue::Uint32(bf16 ? 32 : 0));
  if (Status s = WriteGguf(out, metadata, tensors); !s.ok()) return Fail(s.ToString());
  return 0;
}

int FromDir(const std::string& dir, const std::string& out) {
  StatusOr<Checkpoint> checkpoint = LoadCheckpoint(dir);
  if (!checkpoint.ok()) return Fail(checkpoint.status().ToString());
  StatusOr<Tokenizer> tokenizer = Tokenizer::Load(dir + "/tokenizer.json");
  if (!tokenizer.ok()) return Fail(tokenizer.status().ToString());
  const std::string error = testing::WriteLlamaGguf(*checkpoint, out, GgmlType::kF32,
                                                    testing::TokenizerMetadata(*tokenizer));
  return error.empty() ? 0 : Fail(error);
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 1 && args[0] == "--types") return DumpTypes();
  if (args.size() == 2 && args[0] == "--quantize") return Quantize(args[1]);
  if (args.size() == 3 && args[0] == "--f32") return Convert(args[1], args[2], false);
  if (args.size() == 3 && args[0] == "--bf16") return Convert(args[1], args[2], true);
  if (args.size() == 3 && args[0] == "--from-dir") return FromDir(args[1], args[2]);
  if (args.size() == 1 && args[0].rfind("--", 0) != 0) return Dump(args[0]);
  std::fprintf(
      stderr,
      "usage: gguf_dequant_dump FILE | --types | --quantize TYPE | --f32 IN OUT | --bf16 IN OUT "
      "| --from-dir DIR OUT\n");
  return 2;
}
