// libFuzzer target: the safetensors reader on arbitrary files. Open must return an error or a
// file whose tensors tile the data area inside the mapping, each of the size its shape and
// dtype give; never crash or read out of bounds (ASan).
#include <cstddef>
#include <cstdint>

#include "lib/model/io/safetensors.h"
#include "tests/fuzz/fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vtoken;
  const std::string path = fuzz::WriteInput(data, size, ".safetensors");
  for (bool tolerate_gaps : {false, true}) {
    StatusOr<model::SafetensorsFile> f = model::SafetensorsFile::Open(path, tolerate_gaps);
    if (!f.ok()) continue;
    size_t total = 0;
    for (const model::TensorView& t : f->tensors()) {
      if (f->Find(t.name) != &t) fuzz::Fail("Find(" + t.name + ") is another tensor");
      volatile uint8_t sink = 0;  // Touch every byte: ASan checks they are mapped.
      for (std::byte b : t.bytes) sink = sink ^ static_cast<uint8_t>(b);
      total += t.bytes.size();
    }
    if (total > size) fuzz::Fail("tensors hold more bytes than the file");
    if (!tolerate_gaps && !f->layout_error().ok()) fuzz::Fail("strict open kept a layout error");
  }
  return 0;
}
