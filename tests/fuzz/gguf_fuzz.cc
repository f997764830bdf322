// libFuzzer target: the GGUF reader on arbitrary files. Open must return an error or a file
// whose tensors lie inside the mapping, aligned, without overlaps, each of the size its dims and
// type give; the supported types must dequantize; writing the file back with WriteGguf and
// reading that must give the same metadata and tensors. Never crash or read out of bounds (ASan).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "lib/model/io/ggml_quants.h"
#include "lib/model/io/gguf.h"
#include "tests/fuzz/fuzz_file.h"

namespace {

using namespace vtoken;
using model::GgufType;
using model::GgufValue;

// == with NaN equal to NaN: a float32 NaN may come back quieted through the double `real`.
bool SameValue(const GgufValue& a, const GgufValue& b) {
  if (a.type != b.type || a.integer != b.integer || a.uinteger != b.uinteger ||
      a.boolean != b.boolean || a.string != b.string || a.element_type != b.element_type ||
      a.elements.size() != b.elements.size()) {
    return false;
  }
  if (!(a.real == b.real || (std::isnan(a.real) && std::isnan(b.real)))) return false;
  for (size_t i = 0; i < a.elements.size(); ++i) {
    if (!SameValue(a.elements[i], b.elements[i])) return false;
  }
  return true;
}

void CheckTensors(const model::GgufFile& f, size_t size) {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const model::GgufTensor& t : f.tensors()) {
    if (f.Find(t.name) != &t) fuzz::Fail("Find(" + t.name + ") is another tensor");
    const model::GgmlTypeTraits traits = *model::GgmlTypeInfo(static_cast<uint32_t>(t.type));
    if (t.dims.empty() || t.dims.size() > 4) fuzz::Fail(t.name + ": n_dims outside 1..4");
    if (t.dims[0] % traits.block_size != 0) fuzz::Fail(t.name + ": partial block");
    const uint64_t want = static_cast<uint64_t>(t.num_elements() / traits.block_size) *
                          static_cast<uint64_t>(traits.type_size);
    if (t.bytes.size() != want) fuzz::Fail(t.name + ": byte size disagrees with dims and type");
    if (t.offset < f.data_offset() || (t.offset - f.data_offset()) % f.alignment() != 0) {
      fuzz::Fail(t.name + ": offset outside the data area or misaligned");
    }
    if (t.offset + t.bytes.size() > size) fuzz::Fail(t.name + ": data past the end");
    ranges.emplace_back(t.offset, t.offset + t.bytes.size());
    volatile uint8_t sink = 0;  // Touch every byte: ASan checks they are mapped.
    for (std::byte b : t.bytes) sink = sink ^ static_cast<uint8_t>(b);
    if (model::CanDequantize(t.type) && t.num_elements() <= (1 << 16)) {
      std::vector<float> out(static_cast<size_t>(t.num_elements()));
      if (!model::DequantizeTensor(t, out).ok()) fuzz::Fail(t.name + ": dequantization failed");
    }
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) fuzz::Fail("tensors overlap");
  }
}

// Writes `f` back and checks that the copy reads the same.
void CheckRoundTrip(const model::GgufFile& f) {
  std::vector<model::GgufTensorToWrite> tensors;
  for (const model::GgufTensor& t : f.tensors()) {
    tensors.push_back({t.name, t.type, t.dims, t.bytes});
  }
  const std::string copy_path = f.path() + ".copy";
  Status s = model::WriteGguf(copy_path, f.metadata(), tensors, f.version());
  if (!s.ok()) fuzz::Fail("WriteGguf refused what Open accepted: " + s.ToString());
  StatusOr<model::GgufFile> copy = model::GgufFile::Open(copy_path);
  if (!copy.ok()) fuzz::Fail("the written copy does not open: " + copy.status().ToString());
  if (copy->version() != f.version() || copy->alignment() != f.alignment()) {
    fuzz::Fail("the copy's version or alignment differs");
  }
  if (copy->metadata().keys() != f.metadata().keys()) fuzz::Fail("the copy's keys differ");
  for (const std::string& key : f.metadata().keys()) {
    if (!SameValue(*copy->metadata().Find(key), *f.metadata().Find(key))) {
      fuzz::Fail("the copy's value of " + key + " differs");
    }
  }
  if (copy->tensors().size() != f.tensors().size()) fuzz::Fail("the copy's tensors differ");
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const model::GgufTensor &a = f.tensors()[i], &b = copy->tensors()[i];
    if (a.name != b.name || a.type != b.type || a.dims != b.dims ||
        !std::ranges::equal(a.bytes, b.bytes)) {
      fuzz::Fail("the copy's tensor " + a.name + " differs");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::WriteInput(data, size, ".gguf");
  StatusOr<model::GgufFile> f = model::GgufFile::Open(path);
  if (!f.ok()) {
    const StatusCode code = f.status().code();
    if (code != StatusCode::kDataLoss && code != StatusCode::kInvalidArgument) {
      fuzz::Fail("unexpected error code: " + f.status().ToString());
    }
    if (f.status().message().find('\n') != std::string::npos) fuzz::Fail("error is not one line");
    return 0;
  }
  CheckTensors(*f, size);
  CheckRoundTrip(*f);
  return 0;
}
