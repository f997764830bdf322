// The tokenizer of the real SmolLM2-135M-Instruct GGUF file against llama.cpp's own tokenization
// of it (tests/fixtures/smollm2_llamacpp, written by scripts/make-llamacpp-fixture.py with
// llama-cpp-python). The model file is smollm2-135m as smollm2_path.h finds it (ctest's fixture
// fetches it first), the fixtures come from VTOKEN_SOURCE_DIR; a missing one fails the test,
// never skips it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "lib/model/io/chat_template.h"
#include "lib/model/io/gguf.h"
#include "lib/model/io/gguf_tokenizer.h"
#include "tests/model/smollm2_path.h"

namespace vtoken::model {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using Ids = std::vector<int32_t>;

// The file `variable` + `suffix` names, or a failure saying what is missing; `hint` says where the
// file comes from.
::testing::AssertionResult FileFromEnvironment(const char* variable, const std::string& suffix,
                                               const char* hint, std::string& path) {
  const char* value = std::getenv(variable);
  if (value == nullptr || *value == '\0') {
    return ::testing::AssertionFailure() << variable << " is not set (" << hint << ")";
  }
  path = std::string(value) + suffix;
  if (!fs::is_regular_file(path)) {
    return ::testing::AssertionFailure()
           << variable << " gives '" << path << "', which is not a file (" << hint << ")";
  }
  return ::testing::AssertionSuccess();
}

constexpr char kSourceHint[] = "ctest sets it to the source tree";

class SmolLm2TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    StatusOr<std::string> found = testing::SmolLm2Path();
    if (!found.ok()) {
      setup_error_ = found.status().ToString();
      return;
    }
    const std::string path = *found;
    auto file = GgufFile::Open(path);
    if (!file.ok()) {
      setup_error_ = file.status().ToString();
      return;
    }
    auto tokenizer = TokenizerFromGguf(file->metadata(), path);
    if (!tokenizer.ok()) {
      setup_error_ = tokenizer.status().ToString();
      return;
    }
    auto chat = ChatTemplateFromGguf(file->metadata(), path);
    if (!chat.ok()) {
      setup_error_ = chat.status().ToString();
      return;
    }
    tokenizer_ = new Tokenizer(std::move(tokenizer).value());
    chat_template_ = new ChatTemplate(std::move(chat).value());
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete chat_template_;
    tokenizer_ = nullptr;
    chat_template_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(tokenizer_, nullptr) << setup_error_; }

  // The "cases" of a fixture file in tests/fixtures/smollm2_llamacpp.
  static Json FixtureCases(const std::string& name) {
    std::string path;
    ::testing::AssertionResult found = FileFromEnvironment(
        "VTOKEN_SOURCE_DIR", "/tests/fixtures/smollm2_llamacpp/" + name, kSourceHint, path);
    EXPECT_TRUE(found);
    if (!found) return Json::array();
    Json root = Json::parse(std::ifstream(path));
    EXPECT_TRUE(root.contains("cases")) << path;
    return root.value("cases", Json::array());
  }

  static const Tokenizer& tok() { return *tokenizer_; }

  static inline Tokenizer* tokenizer_ = nullptr;
  static inline ChatTemplate* chat_template_ = nullptr;
  static inline std::string setup_error_;
};

TEST_F(SmolLm2TokenizerTest, TheFileDescribesTheTokenizerWeExpect) {
  EXPECT_EQ(tok().vocab_size(), 49152);
  EXPECT_EQ(tok().num_merges(), 48900);
  EXPECT_EQ(tok().spec().pattern, SplitPattern::kSmolLm);
  EXPECT_EQ(tok().bos_id(), 1);  // <|im_start|>
  EXPECT_EQ(tok().eos_id(), 2);  // <|im_end|>
  EXPECT_EQ(tok().eot_id(), 2);
  // add_bos_token is false: llama.cpp prepends nothing, and neither do we.
  EXPECT_EQ(tok().template_bos_id(), std::nullopt);
  EXPECT_EQ(tok().spec().added_tokens.size(), 17u);  // The 17 control tokens, ids 0..16.
}

// Every fixture text encodes to llama.cpp's ids, with and without parse_special, and decodes
// back to its bytes.
TEST_F(SmolLm2TokenizerTest, EncodesAsLlamaCppDoes) {
  const Json cases = FixtureCases("tokenize.json");
  ASSERT_GE(cases.size(), 40u);
  for (const Json& c : cases) {
    const std::string text = c.at("text").get<std::string>();
    SCOPED_TRACE("text " + Json(text).dump());
    const Ids ids = c.at("ids").get<Ids>();
    const Ids ids_no_special = c.at("ids_no_special").get<Ids>();
    EXPECT_EQ(tok().Encode(text), ids);
    EXPECT_EQ(tok().Encode(text, /*parse_special=*/false), ids_no_special);
    EXPECT_EQ(tok().Decode(ids), text);
    EXPECT_EQ(tok().Decode(ids_no_special), text);
  }
}

// The prompts llama.cpp decoded from: raw text without special tokens, and the chat format,
// which our chat template renders from the raw prompt.
TEST_F(SmolLm2TokenizerTest, PromptsAndChatTemplateAsLlamaCpp) {
  ASSERT_NE(chat_template_, nullptr);
  EXPECT_EQ(chat_template_->kind, ChatTemplate::Kind::kChatMl);
  EXPECT_EQ(chat_template_->default_system,
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  EXPECT_EQ(chat_template_->bos_token, "");

  const Json cases = FixtureCases("greedy.json");
  ASSERT_FALSE(cases.empty());
  std::map<std::string, std::string> raw_prompts;
  for (const Json& c : cases) {
    if (c.at("format") == "raw") raw_prompts[c.at("name")] = c.at("text");
  }
  int num_chat = 0;
  for (const Json& c : cases) {
    const std::string name = c.at("name").get<std::string>();
    const std::string format = c.at("format").get<std::string>();
    const std::string text = c.at("text").get<std::string>();
    SCOPED_TRACE(name + " (" + format + ")");
    const Ids prompt_ids = c.at("prompt_ids").get<Ids>();
    if (format == "raw") {
      EXPECT_EQ(tok().Encode(text, /*parse_special=*/false), prompt_ids);
    } else {
      ASSERT_EQ(format, "chatml");
      ASSERT_TRUE(raw_prompts.contains(name));
      EXPECT_EQ(RenderUserTurn(*chat_template_, raw_prompts[name]), text);
      EXPECT_EQ(tok().Encode(text), prompt_ids);
      ++num_chat;
    }
    EXPECT_EQ(tok().Decode(prompt_ids), text);
  }
  EXPECT_EQ(num_chat, static_cast<int>(raw_prompts.size()));
}

}  // namespace
}  // namespace vtoken::model
