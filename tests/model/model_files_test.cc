// model_files.h: how a model is named (a path, or a short name looked up in the caches in their
// documented order, with one-line errors saying how to fetch it) and the chat wrap around a
// prompt (one BOS, never two).
#include "lib/model/io/model_files.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace vtoken::model {
namespace {

namespace fs = std::filesystem;

class ModelFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("vtoken_model_files_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ::unsetenv("VTOKEN_MODELS_DIR");
    ::unsetenv("VTOKEN_CACHE_DIR");
  }
  void TearDown() override {
    ::unsetenv("VTOKEN_MODELS_DIR");
    ::unsetenv("VTOKEN_CACHE_DIR");
    fs::remove_all(dir_);
  }
  // An empty file at dir_/relative.
  std::string Touch(const std::string& relative) {
    const fs::path p = dir_ / relative;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << "";
    return p.string();
  }
  fs::path dir_;
};

TEST_F(ModelFilesTest, ExistingPathsAreThemselves) {
  const std::string file = Touch("m.gguf");
  EXPECT_EQ(*ResolveModelPath(file), file);
  EXPECT_TRUE(IsModelFile(file));
  EXPECT_EQ(*ResolveModelPath(dir_.string()), dir_.string());
  EXPECT_FALSE(IsModelFile(dir_.string()));
  StatusOr<std::string> missing = ResolveModelPath((dir_ / "none").string());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), "model " + (dir_ / "none").string() + " not found");
}

TEST_F(ModelFilesTest, ShortNamesFollowTheCacheOrder) {
  const std::string in_models = Touch("models_dir/tiny/a.gguf");
  const std::string in_cache = Touch("cache/models/tiny/b.gguf");
  ::setenv("VTOKEN_CACHE_DIR", (dir_ / "cache").c_str(), 1);
  EXPECT_EQ(*ResolveModelPath("tiny"), in_cache);
  ::setenv("VTOKEN_MODELS_DIR", (dir_ / "models_dir").c_str(), 1);
  EXPECT_EQ(*ResolveModelPath("tiny"), in_models);  // VTOKEN_MODELS_DIR alone when set
  Touch("models_dir/tiny/c.gguf");
  StatusOr<std::string> two = ResolveModelPath("tiny");
  EXPECT_EQ(two.status().code(), StatusCode::kNotFound);
  EXPECT_NE(two.status().message().find("holds more than one .gguf file"), std::string::npos);
}

TEST_F(ModelFilesTest, UnknownAndUnfetchedNamesSayWhatToDo) {
  ::setenv("VTOKEN_MODELS_DIR", dir_.c_str(), 1);
  StatusOr<std::string> unknown = ResolveModelPath("no-such-model");
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  // The known names come from the source tree's models/registry.
  EXPECT_NE(unknown.status().message().find("not a file, a directory or a known model name "
                                            "(known: smollm2-135m)"),
            std::string::npos)
      << unknown.status().message();
  StatusOr<std::string> unfetched = ResolveModelPath("smollm2-135m");
  EXPECT_EQ(unfetched.status().code(), StatusCode::kNotFound);
  EXPECT_NE(unfetched.status().message().find("is not fetched yet"), std::string::npos);
  EXPECT_NE(unfetched.status().message().find("run scripts/fetch-model.sh smollm2-135m"),
            std::string::npos)
      << unfetched.status().message();
}

TEST(ChatWrapTest, SplitsTheRenderedTurnAroundTheContent) {
  ChatTemplate chatml;
  chatml.kind = ChatTemplate::Kind::kChatMl;
  chatml.default_system = "Be brief.";
  chatml.end_of_turn = "<|im_end|>";
  const ChatWrap w = ChatWrapFor(chatml, /*engine_adds_bos=*/false);
  EXPECT_EQ(w.before + "hi" + w.after, RenderUserTurn(chatml, "hi"));
  EXPECT_EQ(w.before, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n");
  EXPECT_EQ(w.after, "<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatWrapTest, ATemplateBosIsLeftOutWhenTheEngineAddsOne) {
  ChatTemplate llama3;
  llama3.kind = ChatTemplate::Kind::kLlama3;
  llama3.end_of_turn = "<|eot_id|>";
  llama3.bos_token = "<|begin_of_text|>";
  const std::string rendered = RenderUserTurn(llama3, "hi");
  ASSERT_EQ(rendered.rfind("<|begin_of_text|>", 0), 0u) << rendered;
  const ChatWrap kept = ChatWrapFor(llama3, /*engine_adds_bos=*/false);
  EXPECT_EQ(kept.before + "hi" + kept.after, rendered);
  const ChatWrap dropped = ChatWrapFor(llama3, /*engine_adds_bos=*/true);
  EXPECT_EQ("<|begin_of_text|>" + dropped.before + "hi" + dropped.after, rendered);
}

}  // namespace
}  // namespace vtoken::model
