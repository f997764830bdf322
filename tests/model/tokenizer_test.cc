#include "lib/model/io/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "lib/model/io/pretokenizer.h"

namespace vtoken::model {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;
using Pieces = std::vector<std::string_view>;
using Ids = std::vector<int32_t>;

// ---- split patterns --------------------------------------------------------------------------

TEST(PreTokenizeTest, Llama3Contractions) {
  EXPECT_EQ(PreTokenize(SplitPattern::kLlama3, "I'm HERE'S they'll 'tis"),
            (Pieces{"I", "'m", " HERE", "'S", " they", "'ll", " '", "tis"}));
  EXPECT_EQ(PreTokenize(SplitPattern::kLlama3, "'tis"), (Pieces{"'t", "is"}));
}

TEST(PreTokenizeTest, Gpt2ContractionsAreCaseSensitive) {
  EXPECT_EQ(PreTokenize(SplitPattern::kGpt2, "I'm HERE'S"), (Pieces{"I", "'m", " HERE", "'", "S"}));
}

TEST(PreTokenizeTest, DigitGroups) {
  EXPECT_EQ(PreTokenize(SplitPattern::kLlama3, "a 12345b"), (Pieces{"a", " ", "123", "45", "b"}));
  EXPECT_EQ(PreTokenize(SplitPattern::kQwen2, "a 12345b"),
            (Pieces{"a", " ", "1", "2", "3", "4", "5", "b"}));
  EXPECT_EQ(PreTokenize(SplitPattern::kGpt2, "a 12345b"), (Pieces{"a", " 12345", "b"}));
}

// Expected pieces from Hugging Face tokenizers 0.23.3: pre_tokenizers.Sequence([Digits(
// individual_digits=True), ByteLevel(add_prefix_space=False, use_regex=True)]).pre_tokenize_str.
TEST(PreTokenizeTest, SmolLmIsolatesEveryNumberBeforeGpt2sRegex) {
  EXPECT_EQ(PreTokenize(SplitPattern::kSmolLm, "a 12345b"),
            (Pieces{"a", " ", "1", "2", "3", "4", "5", "b"}));
  EXPECT_EQ(PreTokenize(SplitPattern::kSmolLm, "x1 y"), (Pieces{"x", "1", " y"}));
  EXPECT_EQ(PreTokenize(SplitPattern::kSmolLm, "Price: 3.50$"),
            (Pieces{"Price", ":", " ", "3", ".", "5", "0", "$"}));
  // The regex runs on each stretch alone: a whitespace run before a digit ends its stretch, so
  // \s+(?!\S) keeps all of it.
  EXPECT_EQ(PreTokenize(SplitPattern::kSmolLm, "a  1"), (Pieces{"a", "  ", "1"}));
  EXPECT_EQ(PreTokenize(SplitPattern::kSmolLm, "a \t1b"), (Pieces{"a", " \t", "1", "b"}));
  EXPECT_EQ(PreTokenize(SplitPattern::kSmolLm, "hi\n\n  3 there\n"),
            (Pieces{"hi", "\n\n  ", "3", " there", "\n"}));
  // \p{N} beyond ASCII: superscript two, Arabic-Indic three.
  EXPECT_EQ(PreTokenize(SplitPattern::kSmolLm, "v²=٣x"), (Pieces{"v", "²", "=", "٣", "x"}));
  EXPECT_EQ(PreTokenize(SplitPattern::kSmolLm, "don't 42's"),
            (Pieces{"don", "'t", " ", "4", "2", "'s"}));
  EXPECT_EQ(PreTokenize(SplitPattern::kSmolLm, ""), (Pieces{}));
}

TEST(PreTokenizeTest, WhitespaceRunsBeforeWords) {
  EXPECT_EQ(PreTokenize(SplitPattern::kLlama3, "a   b  "), (Pieces{"a", "  ", " b", "  "}));
  EXPECT_EQ(PreTokenize(SplitPattern::kGpt2, "a   b  "), (Pieces{"a", "  ", " b", "  "}));
  // Llama 3 glues any single non-letter, non-newline character to the following word.
  EXPECT_EQ(PreTokenize(SplitPattern::kLlama3, "\tword (x"), (Pieces{"\tword", " (", "x"}));
  EXPECT_EQ(PreTokenize(SplitPattern::kLlama3, "(x"), (Pieces{"(x"}));
  EXPECT_EQ(PreTokenize(SplitPattern::kGpt2, "\tword (x"), (Pieces{"\t", "word", " (", "x"}));
  EXPECT_EQ(PreTokenize(SplitPattern::kGpt2, "(x"), (Pieces{"(", "x"}));
}

TEST(PreTokenizeTest, Newlines) {
  EXPECT_EQ(PreTokenize(SplitPattern::kLlama3, "hi\n\n  there\r\n"),
            (Pieces{"hi", "\n\n", " ", " there", "\r\n"}));
  EXPECT_EQ(PreTokenize(SplitPattern::kLlama3, "end.\n\nNext"), (Pieces{"end", ".\n\n", "Next"}));
  EXPECT_EQ(PreTokenize(SplitPattern::kGpt2, "hi\n\n  there\n"),
            (Pieces{"hi", "\n\n ", " there", "\n"}));
}

TEST(PreTokenizeTest, PunctuationRuns) {
  EXPECT_EQ(PreTokenize(SplitPattern::kLlama3, "Hello!!! ...world"),
            (Pieces{"Hello", "!!!", " ...", "world"}));
  EXPECT_EQ(PreTokenize(SplitPattern::kGpt2, "Hello!!! ...world"),
            (Pieces{"Hello", "!!!", " ...", "world"}));
}

TEST(PreTokenizeTest, NonAsciiLetters) {
  EXPECT_EQ(PreTokenize(SplitPattern::kLlama3, "naïve café Ωμέγα Москва 中文²"),
            (Pieces{"naïve", " café", " Ωμέγα", " Москва", " 中文", "²"}));
  // U+00A0 (no-break space) is whitespace but not " ", so GPT-2 keeps it apart from the word.
  EXPECT_EQ(PreTokenize(SplitPattern::kGpt2, "a\u00A0b"), (Pieces{"a", "\u00A0", "b"}));
}

TEST(PreTokenizeTest, NumberFormsHoldTwoLetters) {
  // U+2160..U+2188 are Roman numerals except U+2183 / U+2184 (reversed C), which are letters.
  EXPECT_TRUE(IsNumber(0x2182));
  EXPECT_TRUE(IsLetter(0x2183) && IsLetter(0x2184));
  EXPECT_FALSE(IsNumber(0x2183) || IsNumber(0x2184));
  EXPECT_TRUE(IsNumber(0x2185));
}

TEST(PreTokenizeTest, InvalidUtf8IsSplitLikePunctuation) {
  EXPECT_EQ(PreTokenize(SplitPattern::kLlama3, "ab\xFF\xFE cd\xC3"),
            (Pieces{"ab", "\xFF\xFE", " cd", "\xC3"}));
}

TEST(PreTokenizeTest, KnownRegexesAreRecognized) {
  for (SplitPattern p : {SplitPattern::kGpt2, SplitPattern::kLlama3, SplitPattern::kQwen2}) {
    EXPECT_EQ(SplitPatternFromRegex(SplitPatternRegex(p)), p) << SplitPatternName(p);
  }
  EXPECT_EQ(SplitPatternFromRegex("\\d+"), std::nullopt);
  // SmolLM's ByteLevel step runs GPT-2's regex; one Split with that regex is plain GPT-2.
  EXPECT_EQ(SplitPatternRegex(SplitPattern::kSmolLm), SplitPatternRegex(SplitPattern::kGpt2));
  EXPECT_EQ(SplitPatternFromRegex(SplitPatternRegex(SplitPattern::kSmolLm)), SplitPattern::kGpt2);
  EXPECT_STREQ(SplitPatternName(SplitPattern::kSmolLm), "smollm");
}

TEST(ByteLevelTest, MappingIsGpt2s) {
  EXPECT_EQ(ByteToUnicode(' '), "Ġ");
  EXPECT_EQ(ByteToUnicode('\n'), "Ċ");
  EXPECT_EQ(ByteToUnicode('A'), "A");
  EXPECT_EQ(ByteToUnicode(0xAD), "Ń");
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(UnicodeToByte(DecodeUtf8(ByteToUnicode(static_cast<uint8_t>(b))).first), b);
  }
}

// ---- fixture tokenizers --------------------------------------------------------------------

constexpr int32_t kBos = 264;
constexpr int32_t kEos = 265;

// Vocab: the 256 bytes at id == byte value, then merged tokens, then "xyz" reachable only when
// merges are ignored.
Json FixtureJson(bool merges_as_arrays, bool ignore_merges) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteToUnicode(static_cast<uint8_t>(b))] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"b", "c"}, {"a", "b"}, {"a", "a"}};
  int32_t next = 256;
  Json merges_json = Json::array();
  for (const auto& [a, b] : merges) {
    vocab[a + b] = next++;
    merges_json.push_back(merges_as_arrays ? Json::array({a, b}) : Json(a + " " + b));
  }
  vocab["xyz"] = next++;  // 262
  vocab["ĠĠ"] = next++;   // 263, no merge either
  Json root;
  root["added_tokens"] =
      Json::array({{{"id", kBos}, {"content", "<|begin_of_text|>"}, {"special", true}},
                   {{"id", kEos}, {"content", "<|end_of_text|>"}, {"special", true}}});
  root["normalizer"] = nullptr;
  root["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"Regex", std::string(SplitPatternRegex(SplitPattern::kLlama3))}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  root["post_processor"] = nullptr;
  root["decoder"] = {{"type", "ByteLevel"}};
  root["model"] = {
      {"type", "BPE"}, {"ignore_merges", ignore_merges}, {"vocab", vocab}, {"merges", merges_json}};
  return root;
}

class TokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("vtoken_tokenizer_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

  Tokenizer LoadJson(const Json& json) {
    auto tok = Tokenizer::Load(Write("tokenizer.json", json.dump()));
    EXPECT_TRUE(tok.ok()) << tok.status().ToString();
    return std::move(tok).value();
  }

  // Loads `json` and returns the error; the file path must appear in the message.
  Status LoadError(const std::string& text) {
    std::string path = Write("bad.json", text);
    auto tok = Tokenizer::Load(path);
    EXPECT_FALSE(tok.ok());
    if (tok.ok()) return Status::Ok();
    EXPECT_NE(tok.status().message().find(path), std::string::npos) << tok.status().message();
    return tok.status();
  }

  fs::path dir_;
};

TEST_F(TokenizerTest, EncodesCraftedStringsWithBothMergeFormats) {
  for (bool arrays : {false, true}) {
    SCOPED_TRACE(arrays ? "merges as arrays" : "merges as strings");
    Tokenizer tok = LoadJson(FixtureJson(arrays, /*ignore_merges=*/false));
    EXPECT_EQ(tok.vocab_size(), 266);
    EXPECT_EQ(tok.num_merges(), 6);
    EXPECT_EQ(tok.Encode(" the"), (Ids{258}));
    EXPECT_EQ(tok.Encode("the"), (Ids{'t', 257}));
    // (b, c) ranks before (a, b): "abc" -> a + bc, although "ab" is a token.
    EXPECT_EQ(tok.Encode("abc"), (Ids{'a', 259}));
    EXPECT_EQ(tok.Encode("abd"), (Ids{260, 'd'}));
    // Equal-rank overlapping pairs merge leftmost first.
    EXPECT_EQ(tok.Encode("aaa"), (Ids{261, 'a'}));
    EXPECT_EQ(tok.Encode("aaaa"), (Ids{261, 261}));
    EXPECT_EQ(tok.Encode("the the"), (Ids{'t', 257, 258}));
    EXPECT_EQ(tok.Encode(""), (Ids{}));
    EXPECT_EQ(tok.Decode(Ids{'t', 257, 258}), "the the");
  }
}

TEST_F(TokenizerTest, AddedTokensAreSplitOutAndNeverMerged) {
  Tokenizer tok = LoadJson(FixtureJson(false, false));
  EXPECT_EQ(tok.Encode("<|begin_of_text|> the<|end_of_text|>"), (Ids{kBos, 258, kEos}));
  // " t" + "he" would merge to " the" without the special token in between.
  EXPECT_EQ(tok.Encode(" t<|begin_of_text|>he"), (Ids{256, kBos, 257}));
  EXPECT_EQ(tok.Encode("<|end_of_text|><|end_of_text|>"), (Ids{kEos, kEos}));
  // An incomplete special token is plain text.
  EXPECT_EQ(tok.Encode("<|end_of_text").size(), 13u);
  EXPECT_EQ(tok.TokenId("<|begin_of_text|>"), kBos);
  EXPECT_EQ(tok.TokenId("Ġthe"), 258);
  EXPECT_EQ(tok.TokenId("nope"), std::nullopt);
  EXPECT_EQ(tok.bos_id(), kBos);
  EXPECT_EQ(tok.eos_id(), kEos);
  EXPECT_EQ(tok.Decode(Ids{kBos, 258, kEos}), "<|begin_of_text|> the<|end_of_text|>");
  // Ids naming no token are skipped.
  EXPECT_EQ(tok.Decode(Ids{-1, 'a', 266, 100000}), "a");
}

TEST_F(TokenizerTest, IgnoreMergesEmitsWholeVocabPreTokens) {
  Tokenizer with_merges = LoadJson(FixtureJson(false, /*ignore_merges=*/false));
  Tokenizer ignoring = LoadJson(FixtureJson(false, /*ignore_merges=*/true));
  EXPECT_EQ(with_merges.Encode("xyz"), (Ids{'x', 'y', 'z'}));
  EXPECT_EQ(ignoring.Encode("xyz"), (Ids{262}));
  // "  " is a pre-token of its own before the trailing "a"; only its whole form is in the vocab.
  EXPECT_EQ(with_merges.Encode("   a"), (Ids{' ', ' ', ' ', 'a'}));
  EXPECT_EQ(ignoring.Encode("   a"), (Ids{263, ' ', 'a'}));
  EXPECT_EQ(ignoring.Encode("xyzz"), (Ids{'x', 'y', 'z', 'z'}));
  EXPECT_EQ(ignoring.Encode(" the"), (Ids{258}));
}

TEST_F(TokenizerTest, EveryByteStringRoundTrips) {
  Tokenizer tok = LoadJson(FixtureJson(false, false));
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  EXPECT_EQ(tok.Decode(tok.Encode(all)), all);
  // Biased toward bytes that matter to the splitter: spaces, newlines, letters, UTF-8 leads.
  const std::string favorites = " \n\r\t'aAthe1\xC3\xA9\xE4\xB8\xAD\xFF\x80";
  for (int iter = 0; iter < 300; ++iter) {
    std::string s(rng() % 64, '\0');
    for (char& c : s) {
      c = rng() % 2 ? favorites[rng() % favorites.size()] : static_cast<char>(rng() % 256);
    }
    if (rng() % 4 == 0) s.insert(rng() % (s.size() + 1), "<|end_of_text|>");
    ASSERT_EQ(tok.Decode(tok.Encode(s)), s) << "iteration " << iter;
  }
}

TEST_F(TokenizerTest, Gpt2ByteLevelForm) {
  Json json = FixtureJson(false, false);
  json["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  Tokenizer tok = LoadJson(json);
  EXPECT_EQ(tok.spec().pattern, SplitPattern::kGpt2);
  // add_prefix_space turns "the" into " the".
  EXPECT_EQ(tok.Encode("the"), (Ids{258}));
  EXPECT_EQ(tok.Encode("\tthe"), (Ids{' ', '\t', 't', 257}));
}

TEST_F(TokenizerTest, Qwen2FormWithNfcNormalizer) {
  Json json = FixtureJson(false, false);
  json["normalizer"] = {{"type", "NFC"}};
  json["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] =
      std::string(SplitPatternRegex(SplitPattern::kQwen2));
  Tokenizer tok = LoadJson(json);
  EXPECT_EQ(tok.spec().pattern, SplitPattern::kQwen2);
  EXPECT_EQ(tok.Encode("x 123"), (Ids{'x', ' ', '1', '2', '3'}));

  json["normalizer"] = {{"type", "NFKC"}};
  Status s = LoadError(json.dump());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("unsupported normalizer \"NFKC\""), std::string::npos) << s.message();
}

// SmolLM2's tokenizer.json form: Sequence[Digits(individual_digits), ByteLevel(use_regex)].
Json SmolLmPreTokenizer(bool individual_digits, bool add_prefix_space) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Digits"}, {"individual_digits", individual_digits}},
            {{"type", "ByteLevel"},
             {"add_prefix_space", add_prefix_space},
             {"trim_offsets", true},
             {"use_regex", true}}}}};
}

TEST_F(TokenizerTest, SmolLmDigitsFormLoadsAndSavesBack) {
  Json json = FixtureJson(false, false);
  json["pre_tokenizer"] = SmolLmPreTokenizer(true, false);
  Tokenizer tok = LoadJson(json);
  EXPECT_EQ(tok.spec().pattern, SplitPattern::kSmolLm);
  EXPECT_EQ(tok.Encode("x 123"), (Ids{'x', ' ', '1', '2', '3'}));
  EXPECT_EQ(tok.Encode(" the 1the"), (Ids{258, ' ', '1', 't', 257}));

  std::string path = (dir_ / "saved.json").string();
  ASSERT_TRUE(tok.Save(path).ok());
  Json saved = Json::parse(std::ifstream(path));
  EXPECT_EQ(saved["pre_tokenizer"], SmolLmPreTokenizer(true, false));
  auto again = Tokenizer::Load(path);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->spec().pattern, SplitPattern::kSmolLm);
  EXPECT_EQ(again->Encode(" the 1the"), tok.Encode(" the 1the"));
}

TEST_F(TokenizerTest, SmolLmDigitsFormVariantsWeCannotMatch) {
  Json json = FixtureJson(false, false);
  json["pre_tokenizer"] = SmolLmPreTokenizer(false, false);
  Status s = LoadError(json.dump());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("pre_tokenizer Digits without individual_digits"), std::string::npos)
      << s.message();
  json["pre_tokenizer"] = SmolLmPreTokenizer(true, true);
  s = LoadError(json.dump());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("add_prefix_space after Digits"), std::string::npos) << s.message();
}

TEST_F(TokenizerTest, WithoutParseSpecialOnlyNonSpecialAddedTokensAreMatched) {
  Json json = FixtureJson(false, false);
  json["added_tokens"].push_back({{"id", 266}, {"content", "<tool>"}, {"special", false}});
  Tokenizer tok = LoadJson(json);
  const std::string text = "<|end_of_text|><tool> the";
  EXPECT_EQ(tok.Encode(text), (Ids{kEos, 266, 258}));
  Ids as_text = tok.Encode(text, /*parse_special=*/false);
  ASSERT_EQ(as_text.size(), 17u);  // "<|end_of_text|>" byte by byte, then <tool> and " the".
  EXPECT_EQ(as_text[0], '<');
  EXPECT_EQ((Ids(as_text.end() - 2, as_text.end())), (Ids{266, 258}));
  EXPECT_EQ(tok.Decode(as_text), text);
  // A non-special added token survives skip_special; a special one does not.
  EXPECT_EQ(tok.Decode(Ids{kEos, 266}, /*skip_special=*/true), "<tool>");
}

TEST_F(TokenizerTest, ExplicitIdsWinOverNames) {
  Json json = FixtureJson(false, false);
  json["added_tokens"].push_back({{"id", 266}, {"content", "<|im_end|>"}, {"special", true}});
  Tokenizer by_name = LoadJson(json);
  EXPECT_EQ(by_name.bos_id(), kBos);
  EXPECT_EQ(by_name.eos_id(), kEos);
  EXPECT_EQ(by_name.eot_id(), 266);

  TokenizerSpec spec = by_name.spec();
  spec.bos_id = 266;
  spec.eos_id = 'e';
  spec.eot_id = kEos;
  auto tok = Tokenizer::Create(spec);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ(tok->bos_id(), 266);
  EXPECT_EQ(tok->eos_id(), 'e');
  EXPECT_EQ(tok->eot_id(), kEos);
  // An explicit BOS is not a template BOS: nothing is prepended unless bos_token says so.
  EXPECT_EQ(tok->template_bos_id(), std::nullopt);

  spec.eot_id = 267;
  auto bad = Tokenizer::Create(spec);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "EOT id 267 names no token");
}

TEST_F(TokenizerTest, SaveThenLoadGivesTheSameTokenizer) {
  Json json = FixtureJson(true, true);
  json["post_processor"] = {{"type", "TemplateProcessing"},
                            {"single",
                             {{{"SpecialToken", {{"id", "<|end_of_text|>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}}};
  Tokenizer tok = LoadJson(json);
  EXPECT_EQ(tok.bos_id(), kEos);  // The template wins over the name.
  std::string path = (dir_ / "saved.json").string();
  ASSERT_TRUE(tok.Save(path).ok());
  auto again = Tokenizer::Load(path);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->vocab_size(), tok.vocab_size());
  EXPECT_EQ(again->spec().merges, tok.spec().merges);
  EXPECT_TRUE(again->spec().ignore_merges);
  EXPECT_EQ(again->bos_id(), kEos);
  const std::string text = "<|begin_of_text|>xyz abc the aaaa\n\n 123 ünïcödé";
  EXPECT_EQ(again->Encode(text), tok.Encode(text));
}

// Hugging Face's encode(add_special_tokens=True) prepends what the post_processor says, never
// config.json's bos_token_id: PromptBosId follows it.
TEST_F(TokenizerTest, PromptBosFollowsThePostProcessor) {
  ModelConfig with_bos;
  with_bos.bos_token_ids = {kBos};
  ModelConfig without_bos;
  Json json = FixtureJson(false, false);
  {
    SCOPED_TRACE("no post_processor (Qwen2 style): no BOS whatever config.json says");
    Tokenizer tok = LoadJson(json);
    EXPECT_EQ(tok.bos_id(), kBos);                   // The token exists (by name) ...
    EXPECT_EQ(tok.template_bos_id(), std::nullopt);  // ... but nothing prepends it.
    EXPECT_EQ(PromptBosId(&tok, with_bos), std::nullopt);
  }
  {
    SCOPED_TRACE("Llama 3: Sequence[ByteLevel, TemplateProcessing], config without bos_token_id");
    json["post_processor"] = {
        {"type", "Sequence"},
        {"processors",
         {{{"type", "ByteLevel"}, {"trim_offsets", false}},
          {{"type", "TemplateProcessing"},
           {"single",
            {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}}}}}};
    Tokenizer tok = LoadJson(json);
    EXPECT_EQ(tok.template_bos_id(), kBos);
    EXPECT_EQ(PromptBosId(&tok, without_bos), kBos);
  }
  {
    SCOPED_TRACE("TemplateProcessing that starts with the sequence: no BOS");
    json["post_processor"] = {{"type", "TemplateProcessing"},
                              {"single",
                               {{{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                {{"SpecialToken", {{"id", "<|end_of_text|>"}, {"type_id", 0}}}}}}};
    EXPECT_EQ(PromptBosId(&static_cast<const Tokenizer&>(LoadJson(json)), with_bos), std::nullopt);
  }
  {
    SCOPED_TRACE("RobertaProcessing: its cls token");
    json["post_processor"] = {{"type", "RobertaProcessing"},
                              {"sep", {"<|end_of_text|>", kEos}},
                              {"cls", {"<|begin_of_text|>", kBos}}};
    Tokenizer tok = LoadJson(json);
    EXPECT_EQ(PromptBosId(&tok, without_bos), kBos);
    json["post_processor"] = {{"type", "RobertaProcessing"}, {"sep", {"x", 1}}};
    Status s = LoadError(json.dump());
    EXPECT_EQ(s.code(), StatusCode::kDataLoss);
    EXPECT_NE(s.message().find("post_processor RobertaProcessing needs \"cls\""), std::string::npos)
        << s.message();
  }
  // Without a tokenizer (synthetic and sim: models) config.json decides.
  EXPECT_EQ(PromptBosId(nullptr, with_bos), kBos);
  EXPECT_EQ(PromptBosId(nullptr, without_bos), std::nullopt);
}

TEST_F(TokenizerTest, DecodeCanSkipSpecialTokens) {
  Tokenizer tok = LoadJson(FixtureJson(false, false));
  const Ids ids = {kBos, 'a', 0, 'b', kEos};
  EXPECT_EQ(tok.Decode(ids), std::string("<|begin_of_text|>a\0b<|end_of_text|>", 35));
  EXPECT_EQ(tok.Decode(ids, /*skip_special=*/true), std::string("a\0b", 3));
}

TEST_F(TokenizerTest, MissingFile) {
  std::string path = (dir_ / "absent.json").string();
  auto tok = Tokenizer::Load(path);
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(tok.status().message(), "tokenizer '" + path + "': cannot open file");
}

TEST_F(TokenizerTest, InvalidJson) {
  Status s = LoadError("{\"model\": ");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("invalid JSON"), std::string::npos) << s.message();
}

TEST_F(TokenizerTest, UnsupportedModelType) {
  Json json = FixtureJson(false, false);
  json["model"]["type"] = "WordPiece";
  Status s = LoadError(json.dump());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("unsupported model type \"WordPiece\""), std::string::npos)
      << s.message();
}

TEST_F(TokenizerTest, MergeWithUnknownToken) {
  Json json = FixtureJson(false, false);
  json["model"]["merges"].push_back("a Ġzz");
  Status s = LoadError(json.dump());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("merge 6 'a Ġzz': unknown token 'Ġzz'"), std::string::npos)
      << s.message();
}

TEST_F(TokenizerTest, MalformedMergeEntry) {
  Json json = FixtureJson(false, false);
  json["model"]["merges"].push_back("abc");
  Status s = LoadError(json.dump());
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("model.merges[6] 'abc' is not two tokens"), std::string::npos)
      << s.message();
}

TEST_F(TokenizerTest, UnknownSplitRegex) {
  Json json = FixtureJson(false, false);
  json["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\d+|\\w+";
  Status s = LoadError(json.dump());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("unsupported pre_tokenizer Split regex: \\d+|\\w+"), std::string::npos)
      << s.message();
}

TEST_F(TokenizerTest, VocabWithNonIntegerId) {
  Json json = FixtureJson(false, false);
  json["model"]["vocab"]["oops"] = "7";
  Status s = LoadError(json.dump());
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("model.vocab entry 'oops' has a non-integer id"), std::string::npos)
      << s.message();
}

TEST_F(TokenizerTest, AddedTokenReusingAnotherTokensId) {
  Json json = FixtureJson(false, false);
  json["added_tokens"].push_back({{"id", 97}, {"content", "<pad>"}, {"special", true}});
  Status s = LoadError(json.dump());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("added token '<pad>' reuses id 97"), std::string::npos) << s.message();
}

// The bundled vt-tiny tokenizer (VTOKEN_SOURCE_DIR is set by ctest).
TEST(BundledTokenizerTest, VtTinyLoadsAndRoundTrips) {
  const char* src = std::getenv("VTOKEN_SOURCE_DIR");
  if (src == nullptr) GTEST_SKIP() << "VTOKEN_SOURCE_DIR not set";
  auto tok = Tokenizer::Load(std::string(src) + "/models/vt-tiny/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ(tok->vocab_size(), 2048);
  EXPECT_EQ(tok->bos_id(), 2046);
  EXPECT_EQ(tok->eos_id(), 2047);
  // vt-tiny was trained with BOS: its template adds it, as config.json's bos_token_id says.
  EXPECT_EQ(tok->template_bos_id(), 2046);
  auto dir_bos = PromptBosTokenIds(std::string(src) + "/models/vt-tiny", ModelConfig{});
  ASSERT_TRUE(dir_bos.ok()) << dir_bos.status().ToString();
  EXPECT_EQ(*dir_bos, (std::vector<int64_t>{2046}));
  const std::string verse = "1 In the beginning God created the heaven and the earth.\n";
  Ids ids = tok->Encode(verse);
  EXPECT_LT(ids.size(), verse.size() / 3);
  EXPECT_EQ(tok->Decode(ids), verse);
}

}  // namespace
}  // namespace vtoken::model
