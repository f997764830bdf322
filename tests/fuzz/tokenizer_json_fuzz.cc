// libFuzzer target: tokenizer.json loading. An accepted tokenizer must encode text to ids it
// can decode, in range, and give back the text when every byte has a token.
#include <cstddef>
#include <cstdint>
#include <string>

#include "lib/model/io/tokenizer.h"
#include "tests/fuzz/fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vtoken;
  const std::string path = fuzz::WriteInput(data, size, ".tokenizer.json");
  StatusOr<model::Tokenizer> tok = model::Tokenizer::Load(path);
  if (!tok.ok()) return 0;
  // The input itself (any bytes) and a fixed sample.
  const std::string texts[] = {std::string(reinterpret_cast<const char*>(data), size % 256),
                               "And God said, Let there be light: 123 \xc3\xa9\n\n  x"};
  for (const std::string& text : texts) {
    const std::vector<int32_t> ids = tok->Encode(text);
    for (int32_t id : ids) {
      if (id < 0 || id >= tok->vocab_size()) fuzz::Fail("id out of range");
    }
    const std::string back = tok->Decode(ids);
    (void)tok->Decode(ids, /*skip_special=*/true);
    bool all_bytes = true;
    for (int b = 0; b < 256 && all_bytes; ++b) {
      all_bytes = tok->Decode(tok->Encode(std::string(1, static_cast<char>(b)))).size() == 1;
    }
    if (all_bytes && tok->spec().added_tokens.empty() && !tok->spec().add_prefix_space &&
        back != text) {
      fuzz::Fail("Decode(Encode(x)) != x with every byte in the vocab");
    }
  }
  return 0;
}
