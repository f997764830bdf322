#include "lib/model/io/gguf_tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "lib/model/io/pretokenizer.h"

namespace vtoken::model {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;

constexpr int32_t kEndOfText = 0;  // control
constexpr int32_t kImStart = 1;    // control, BOS
constexpr int32_t kImEnd = 2;      // control, EOS
constexpr int32_t kByte0 = 3;      // The 256 single-byte tokens: id kByte0 + byte.
constexpr int32_t kT = 259;        // "Ġt"
constexpr int32_t kHe = 260;       // "he"
constexpr int32_t kThe = 261;      // "Ġthe"
constexpr int32_t kTool = 262;     // user-defined "<tool>"
constexpr int32_t kPad = 263;      // unused "[PAD263]"
constexpr int32_t kUnk = 264;      // unknown-type "<unk>"

int32_t Byte(char c) { return kByte0 + static_cast<uint8_t>(c); }

// A SmolLM2-shaped vocabulary in miniature, as convert_hf_to_gguf.py writes one.
GgufMetadata SmallGguf() {
  std::vector<std::string> tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  std::vector<int32_t> types = {3, 3, 3};
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(ByteToUnicode(static_cast<uint8_t>(b)));
    types.push_back(1);
  }
  for (const char* t : {"Ġt", "he", "Ġthe"}) {
    tokens.push_back(t);
    types.push_back(1);
  }
  tokens.insert(tokens.end(), {"<tool>", "[PAD263]", "<unk>"});
  types.insert(types.end(), {4, 5, 2});
  GgufMetadata md;
  md.Set("tokenizer.ggml.model", GgufValue::String("gpt2"));
  md.Set("tokenizer.ggml.pre", GgufValue::String("smollm"));
  md.Set("tokenizer.ggml.tokens", GgufValue::StringArray(tokens));
  md.Set("tokenizer.ggml.token_type", GgufValue::Int32Array(types));
  md.Set("tokenizer.ggml.merges", GgufValue::StringArray({"Ġ t", "h e", "Ġt he"}));
  md.Set("tokenizer.ggml.bos_token_id", GgufValue::Uint32(kImStart));
  md.Set("tokenizer.ggml.eos_token_id", GgufValue::Uint32(kImEnd));
  md.Set("tokenizer.ggml.unknown_token_id", GgufValue::Uint32(kEndOfText));
  md.Set("tokenizer.ggml.padding_token_id", GgufValue::Uint32(kImEnd));
  md.Set("tokenizer.ggml.add_bos_token", GgufValue::Bool(false));
  return md;
}

// `md` without `key`.
GgufMetadata Without(const GgufMetadata& md, std::string_view key) {
  GgufMetadata out;
  for (const std::string& k : md.keys()) {
    if (k != key) out.Set(k, *md.Find(k));
  }
  return out;
}

Tokenizer Build(const GgufMetadata& md) {
  auto tok = TokenizerFromGguf(md, "small.gguf");
  EXPECT_TRUE(tok.ok()) << tok.status().ToString();
  return std::move(tok).value();
}

// Returns the error of building from `md`, which must fail with `code`.
std::string BuildError(const GgufMetadata& md, StatusCode code = StatusCode::kInvalidArgument) {
  auto tok = TokenizerFromGguf(md, "small.gguf");
  EXPECT_FALSE(tok.ok());
  if (tok.ok()) return "";
  EXPECT_EQ(tok.status().code(), code) << tok.status().ToString();
  return tok.status().message();
}

TEST(GgufTokenizerTest, BuildsByteLevelBpeWithSmolLmSplit) {
  Tokenizer tok = Build(SmallGguf());
  EXPECT_EQ(tok.vocab_size(), 265);
  EXPECT_EQ(tok.num_merges(), 3);
  EXPECT_EQ(tok.spec().pattern, SplitPattern::kSmolLm);
  EXPECT_FALSE(tok.spec().ignore_merges);
  EXPECT_EQ(tok.Encode(" the"), (Ids{kThe}));
  EXPECT_EQ(tok.Encode("the the"), (Ids{Byte('t'), kHe, kThe}));
  // Digits one by one; the space before a digit stays alone.
  EXPECT_EQ(tok.Encode(" the 42"), (Ids{kThe, Byte(' '), Byte('4'), Byte('2')}));
  EXPECT_EQ(tok.Decode(Ids{kThe, Byte(' '), Byte('4')}), " the 4");
  EXPECT_EQ(tok.TokenId("Ġthe"), kThe);
}

TEST(GgufTokenizerTest, ControlTokensAreSpecialUserDefinedTokensAreNot) {
  Tokenizer tok = Build(SmallGguf());
  const std::string text = "<|im_start|>x<tool> the<unk>";
  EXPECT_EQ(tok.Encode(text), (Ids{kImStart, Byte('x'), kTool, kThe, kUnk}));
  // As llama.cpp's parse_special=false: control and unknown tokens are text, user-defined ones
  // are still split out.
  Ids plain = tok.Encode(text, /*parse_special=*/false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), kTool), 1);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), kImStart), 0);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), kUnk), 0);
  EXPECT_EQ(tok.Decode(plain), text);
  // Decoding with skip_special drops control and unknown tokens (llama.cpp's special=false) and
  // keeps user-defined ones.
  EXPECT_EQ(tok.Decode(Ids{kImStart, Byte('x'), kTool, kThe, kUnk}), text);
  EXPECT_EQ(tok.Decode(Ids{kImStart, Byte('x'), kTool, kThe, kUnk}, /*skip_special=*/true),
            "x<tool> the");
  // An unused token is a vocab token: reachable by id, never by text.
  EXPECT_EQ(tok.TokenId("[PAD263]"), kPad);
  EXPECT_EQ(tok.Encode("[PAD263]").size(), 8u);
}

TEST(GgufTokenizerTest, SpecialTokensNeverSplitAndNeverComeFromText) {
  Tokenizer tok = Build(SmallGguf());
  EXPECT_EQ(tok.Encode("<|im_end|><|im_end|>"), (Ids{kImEnd, kImEnd}));
  // " t" + "he" would merge into " the" without the token between them.
  EXPECT_EQ(tok.Encode(" t<|im_end|>he"), (Ids{kT, kImEnd, kHe}));
  EXPECT_EQ(tok.Encode("<|im_end|").size(), 9u);

  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const std::vector<std::pair<std::string, int32_t>> specials = {{"<|endoftext|>", kEndOfText},
                                                                 {"<|im_start|>", kImStart},
                                                                 {"<|im_end|>", kImEnd},
                                                                 {"<tool>", kTool},
                                                                 {"<unk>", kUnk}};
  const std::string alphabet = " the<|>im_end12\n\xC3\xA9";
  for (int iter = 0; iter < 300; ++iter) {
    std::string text;
    std::vector<int32_t> inserted;
    for (int piece = 0; piece < 6; ++piece) {
      for (int k = rng() % 5; k > 0; --k) text += alphabet[rng() % alphabet.size()];
      if (rng() % 2) {
        const auto& [content, id] = specials[rng() % specials.size()];
        text += content;
        inserted.push_back(id);
      }
    }
    Ids ids = tok.Encode(text);
    ASSERT_EQ(tok.Decode(ids), text) << "iteration " << iter;
    for (const auto& [content, id] : specials) {
      // Every special token in the text comes out whole, and none comes from plain text (the
      // alphabet alone cannot spell one, so the counts are exact).
      ASSERT_EQ(std::count(ids.begin(), ids.end(), id),
                std::count(inserted.begin(), inserted.end(), id))
          << "iteration " << iter << " token " << content;
    }
    Ids plain = tok.Encode(text, /*parse_special=*/false);
    for (int32_t id : {kEndOfText, kImStart, kImEnd, kUnk}) {
      ASSERT_EQ(std::count(plain.begin(), plain.end(), id), 0) << "iteration " << iter;
    }
    ASSERT_EQ(tok.Decode(plain), text) << "iteration " << iter;
  }
}

TEST(GgufTokenizerTest, BosIsPrependedExactlyWhenAddBosTokenSaysSo) {
  GgufMetadata md = SmallGguf();
  Tokenizer without = Build(md);
  EXPECT_EQ(without.bos_id(), kImStart);
  EXPECT_EQ(without.eos_id(), kImEnd);
  EXPECT_EQ(without.template_bos_id(), std::nullopt);

  md.Set("tokenizer.ggml.add_bos_token", GgufValue::Bool(true));
  Tokenizer with = Build(md);
  EXPECT_EQ(with.template_bos_id(), kImStart);
  EXPECT_EQ(with.bos_id(), kImStart);

  // Without the key, llama.cpp's default for the pre-tokenizer: true for Llama 3 only.
  GgufMetadata no_key = Without(md, "tokenizer.ggml.add_bos_token");
  EXPECT_EQ(Build(no_key).template_bos_id(), std::nullopt);
  no_key.Set("tokenizer.ggml.pre", GgufValue::String("llama-bpe"));
  Tokenizer llama = Build(no_key);
  EXPECT_EQ(llama.template_bos_id(), kImStart);
  EXPECT_EQ(llama.spec().pattern, SplitPattern::kLlama3);
  EXPECT_TRUE(llama.spec().ignore_merges);

  md.Set("tokenizer.ggml.bos_token_id", GgufValue::Uint32(265));
  EXPECT_EQ(BuildError(md),
            "small.gguf: tokenizer.ggml.bos_token_id 265 is outside the 265 tokens");
}

TEST(GgufTokenizerTest, AddBosWithoutBosIdIsAnError) {
  GgufMetadata md = Without(SmallGguf(), "tokenizer.ggml.bos_token_id");
  EXPECT_EQ(Build(md).bos_id(), std::nullopt);
  md.Set("tokenizer.ggml.add_bos_token", GgufValue::Bool(true));
  EXPECT_EQ(BuildError(md),
            "small.gguf: add_bos_token is true but tokenizer.ggml.bos_token_id is missing");
}

TEST(GgufTokenizerTest, EndOfTurnFromItsKeyElseByName) {
  GgufMetadata md = SmallGguf();
  EXPECT_EQ(Build(md).eot_id(), kImEnd);  // <|im_end|> by name.
  md.Set("tokenizer.ggml.eot_token_id", GgufValue::Uint32(kEndOfText));
  EXPECT_EQ(Build(md).eot_id(), kEndOfText);
}

TEST(GgufTokenizerTest, UnsupportedModelsAndPreTokenizers) {
  GgufMetadata md = SmallGguf();
  md.Set("tokenizer.ggml.model", GgufValue::String("llama"));
  EXPECT_EQ(BuildError(md),
            "small.gguf: tokenizer.ggml.model 'llama' is not supported (only 'gpt2', byte-level "
            "BPE)");
  md = SmallGguf();
  md.Set("tokenizer.ggml.pre", GgufValue::String("deepseek-coder"));
  EXPECT_EQ(BuildError(md), "small.gguf: tokenizer.ggml.pre 'deepseek-coder' is not supported");
  md.Set("tokenizer.ggml.pre", GgufValue::String("default"));
  EXPECT_EQ(BuildError(md), "small.gguf: tokenizer.ggml.pre 'default' is not supported");
  md = SmallGguf();
  md.Set("tokenizer.ggml.model", GgufValue::Uint32(2));
  EXPECT_NE(BuildError(md).find("small.gguf: "), std::string::npos);
}

TEST(GgufTokenizerTest, PreTokenizerNamesFollowLlamaCpp) {
  struct Expected {
    const char* name;
    SplitPattern pattern;
    bool ignore_merges;
    bool add_bos;
  };
  for (const Expected& e : {Expected{"gpt-2", SplitPattern::kGpt2, false, false},
                            Expected{"llama3", SplitPattern::kLlama3, true, true},
                            Expected{"llama-v3", SplitPattern::kLlama3, true, true},
                            Expected{"llama-bpe", SplitPattern::kLlama3, true, true},
                            Expected{"qwen2", SplitPattern::kQwen2, false, false},
                            Expected{"deepseek-r1-qwen", SplitPattern::kQwen2, false, false},
                            Expected{"smollm", SplitPattern::kSmolLm, false, false},
                            Expected{"starcoder", SplitPattern::kSmolLm, false, false}}) {
    SCOPED_TRACE(e.name);
    auto pre = GgufPreTokenizerFromName(e.name);
    ASSERT_TRUE(pre.has_value());
    EXPECT_EQ(pre->pattern, e.pattern);
    EXPECT_EQ(pre->ignore_merges, e.ignore_merges);
    EXPECT_EQ(pre->add_bos_default, e.add_bos);
  }
  for (const char* unknown : {"default", "gpt2", "", "falcon", "SMOLLM"}) {
    EXPECT_EQ(GgufPreTokenizerFromName(unknown), std::nullopt) << unknown;
  }
}

TEST(GgufTokenizerTest, MalformedMetadata) {
  GgufMetadata md = SmallGguf();
  md.Set("tokenizer.ggml.merges", GgufValue::StringArray({"Ġ t", "he"}));
  EXPECT_EQ(BuildError(md),
            "small.gguf: tokenizer.ggml.merges[1] 'he' is not two tokens separated by a space");
  md.Set("tokenizer.ggml.merges", GgufValue::StringArray({"Ġ zz"}));
  EXPECT_EQ(BuildError(md), "small.gguf: merge 0 'Ġ zz': unknown token 'zz'");

  md = SmallGguf();
  std::vector<int32_t> types(265, 1);
  types[100] = 6;
  md.Set("tokenizer.ggml.token_type", GgufValue::Int32Array(types));
  EXPECT_NE(BuildError(md).find("token 100 'a' is a byte token (type 6)"), std::string::npos);
  types[100] = 0;
  md.Set("tokenizer.ggml.token_type", GgufValue::Int32Array(types));
  EXPECT_EQ(BuildError(md), "small.gguf: token 100 'a' has type 0 (not 1..6)");
  types.resize(10);
  md.Set("tokenizer.ggml.token_type", GgufValue::Int32Array(types));
  EXPECT_EQ(BuildError(md), "small.gguf: tokenizer.ggml.token_type has 10 entries for 265 tokens");

  GgufMetadata no_tokens;
  no_tokens.Set("tokenizer.ggml.model", GgufValue::String("gpt2"));
  no_tokens.Set("tokenizer.ggml.pre", GgufValue::String("gpt-2"));
  EXPECT_EQ(BuildError(no_tokens, StatusCode::kNotFound).substr(0, 12), "small.gguf: ");
}

TEST(GgufTokenizerTest, SavedAsTokenizerJsonItLoadsBackTheSame) {
  Tokenizer tok = Build(SmallGguf());
  const fs::path path =
      fs::temp_directory_path() / ("vtoken_gguf_tokenizer_" + std::to_string(::getpid()) + ".json");
  ASSERT_TRUE(tok.Save(path.string()).ok());
  // Hugging Face keeps an added token's id only if model.vocab lists it too.
  const nlohmann::json saved = nlohmann::json::parse(std::ifstream(path));
  EXPECT_EQ(saved["model"]["vocab"]["<|im_start|>"], kImStart);
  EXPECT_EQ(saved["model"]["vocab"]["<tool>"], kTool);
  auto again = Tokenizer::Load(path.string());
  fs::remove(path);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  const std::string text = "<|im_start|>user\n the 2 the<tool><|im_end|>\n";
  EXPECT_EQ(again->Encode(text), tok.Encode(text));
  EXPECT_EQ(again->Encode(text, false), tok.Encode(text, false));
  EXPECT_EQ(again->spec().pattern, SplitPattern::kSmolLm);
}

TEST(GgufTokenizerTest, ChatTemplateFromTheFile) {
  GgufMetadata md = SmallGguf();
  auto missing = ChatTemplateFromGguf(md, "small.gguf");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message().substr(0, 12), "small.gguf: ");

  md.Set("tokenizer.chat_template",
         GgufValue::String("{% for message in messages %}{{'<|im_start|>' + message['role'] + "
                           "'\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if "
                           "add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"));
  auto chatml = ChatTemplateFromGguf(md, "small.gguf");
  ASSERT_TRUE(chatml.ok()) << chatml.status().ToString();
  EXPECT_EQ(chatml->kind, ChatTemplate::Kind::kChatMl);
  EXPECT_EQ(RenderUserTurn(*chatml, "hi"),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");

  md.Set("tokenizer.chat_template", GgufValue::String("{{ bos_token }}{{ messages }}"));
  auto other = ChatTemplateFromGguf(md, "small.gguf");
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(
      other.status().message(),
      "small.gguf: chat template is neither ChatML nor Llama 3: {{ bos_token }}{{ messages }}");
}

}  // namespace
}  // namespace vtoken::model
