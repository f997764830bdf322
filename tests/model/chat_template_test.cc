#include "lib/model/io/chat_template.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace vtoken::model {
namespace {

namespace fs = std::filesystem;

// SmolLM2-135M-Instruct's tokenizer.chat_template, read from the GGUF file with gguf-py:
//   gguf.GGUFReader(path).fields['tokenizer.chat_template'].contents()
// Its literals hold real newlines.
constexpr std::string_view kSmolLm2 =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

// Qwen2-Instruct's template (Qwen/Qwen2-*-Instruct tokenizer_config.json): SmolLM2's with another
// default system.
constexpr std::string_view kQwen2 =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

// Meta-Llama-3-8B-Instruct's template; its literals spell newlines as jinja escapes.
constexpr std::string_view kLlama3 =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

// A tools-aware ChatML template written in Qwen2.5's style (not its text): whitespace control on
// every tag, attribute access, "..." literals, the default system in an else branch.
constexpr std::string_view kToolsChatMl = R"jinja({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are a tool-using assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)jinja";

// ChatML without a default system (OpenHermes style).
constexpr std::string_view kPlainChatMl =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

std::string Escaped(std::string_view jinja) {
  std::string out;
  for (char c : jinja) out += c == '\n' ? std::string("\\n") : std::string(1, c);
  return out;
}

struct RenderCase {
  std::string name;
  std::string jinja;
  std::string user;
  std::string expected;
};

// Every expected string is jinja2 3.1.6's rendering as transformers' apply_chat_template does it
// (ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]),
// messages=[{"role": "user", "content": USER}], add_generation_prompt=True,
// bos_token="<|begin_of_text|>").
std::vector<RenderCase> RenderCases() {
  const std::string smol_system =
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
      "Face<|im_end|>\n";
  const std::string qwen_system = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n";
  return {
      {"smollm2", std::string(kSmolLm2), "Hello!",
       smol_system + "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"},
      // ChatML does not trim.
      {"smollm2", std::string(kSmolLm2), "  spaced out \n",
       smol_system + "<|im_start|>user\n  spaced out \n<|im_end|>\n<|im_start|>assistant\n"},
      {"smollm2", std::string(kSmolLm2), "",
       smol_system + "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n"},
      {"qwen2", std::string(kQwen2), "line1\nline2",
       qwen_system + "<|im_start|>user\nline1\nline2<|im_end|>\n<|im_start|>assistant\n"},
      {"qwen2 with \\n escapes", Escaped(kQwen2), "naïve café 中文",
       qwen_system + "<|im_start|>user\nnaïve café 中文<|im_end|>\n<|im_start|>assistant\n"},
      {"tools-aware chatml", std::string(kToolsChatMl), "Hello!",
       "<|im_start|>system\nYou are a tool-using assistant.<|im_end|>\n<|im_start|>user\n"
       "Hello!<|im_end|>\n<|im_start|>assistant\n"},
      {"plain chatml", std::string(kPlainChatMl), "Hello!",
       "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"},
      {"llama3", std::string(kLlama3), "Hello!",
       "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>"
       "<|start_header_id|>assistant<|end_header_id|>\n\n"},
      // | trim is Python's str.strip(): Unicode whitespace (U+3000) and U+001F go too.
      {"llama3", std::string(kLlama3), "  spaced out \n",
       "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nspaced out<|eot_id|>"
       "<|start_header_id|>assistant<|end_header_id|>\n\n"},
      {"llama3", std::string(kLlama3), "\u3000x\x1f",
       "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>"
       "<|start_header_id|>assistant<|end_header_id|>\n\n"},
      {"llama3", std::string(kLlama3), " \n ",
       "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n<|eot_id|>"
       "<|start_header_id|>assistant<|end_header_id|>\n\n"},
  };
}

TEST(ChatTemplateTest, RendersAUserTurnAsJinjaDoes) {
  for (const RenderCase& c : RenderCases()) {
    SCOPED_TRACE(c.name + " / user '" + c.user + "'");
    auto parsed = ParseChatTemplate(c.jinja, "<|begin_of_text|>");
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(RenderUserTurn(*parsed, c.user), c.expected);
  }
}

TEST(ChatTemplateTest, WhatEachTemplateIsRecognizedAs) {
  auto smol = ParseChatTemplate(kSmolLm2, "<|im_start|>");
  ASSERT_TRUE(smol.ok()) << smol.status().ToString();
  EXPECT_EQ(smol->kind, ChatTemplate::Kind::kChatMl);
  EXPECT_EQ(smol->default_system,
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  EXPECT_EQ(smol->end_of_turn, "<|im_end|>");
  EXPECT_EQ(smol->bos_token, "");  // The template renders no bos_token, whatever BOS is.

  auto plain = ParseChatTemplate(kPlainChatMl);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->default_system, "");

  auto llama = ParseChatTemplate(kLlama3, "<|begin_of_text|>");
  ASSERT_TRUE(llama.ok()) << llama.status().ToString();
  EXPECT_EQ(llama->kind, ChatTemplate::Kind::kLlama3);
  EXPECT_EQ(llama->end_of_turn, "<|eot_id|>");
  EXPECT_EQ(llama->bos_token, "<|begin_of_text|>");
  // Without the tokenizer's BOS text the template's bos_token renders as nothing.
  auto no_bos = ParseChatTemplate(kLlama3);
  ASSERT_TRUE(no_bos.ok());
  EXPECT_EQ(RenderUserTurn(*no_bos, "x"),
            "<|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|><|start_header_id|>assistant"
            "<|end_header_id|>\n\n");
}

// Returns the error message of parsing `jinja`, which must fail with InvalidArgument.
std::string RejectionOf(std::string_view jinja) {
  auto parsed = ParseChatTemplate(jinja, "<s>");
  EXPECT_FALSE(parsed.ok());
  if (parsed.ok()) return "";
  EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
  return parsed.status().message();
}

TEST(ChatTemplateTest, OtherTemplatesAreRejectedQuotingTheirFirstLine) {
  const std::string mistral =
      "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
      "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
      "{{ message['content'] + eos_token}}{% endif %}{% endfor %}";
  EXPECT_EQ(RejectionOf(mistral),
            "chat template is neither ChatML nor Llama 3: " + mistral.substr(0, 77) + "...");
  EXPECT_EQ(RejectionOf("{% if a %}\n{{ 'Hi' }}{% endif %}"),
            "chat template is neither ChatML nor Llama 3: {% if a %}");
  EXPECT_EQ(RejectionOf(""), "chat template is neither ChatML nor Llama 3: ");
}

TEST(ChatTemplateTest, TemplatesThatRenderMoreAreRejected) {
  // Text outside the tags is output verbatim.
  EXPECT_EQ(RejectionOf("<|begin_of_text|>" + std::string(kLlama3)),
            "chat template renders text outside its tags: <|begin_of_text|>{% set loop_messages = "
            "messages %}{% for message in loop_mes...");
  // Whitespace before an expression tag survives trim_blocks and lstrip_blocks ...
  const std::string indented =
      "{% for message in messages %}\n  {{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n'}}\n{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|im_start|>assistant\\n' }}{% endif %}";
  EXPECT_NE(RejectionOf(indented).find("renders text outside its tags"), std::string::npos);
  // ... unless "-" strips it; before block tags lstrip_blocks and trim_blocks do.
  std::string stripped = indented;
  stripped.replace(stripped.find("\n  {{"), 5, "\n  {{-");
  stripped.replace(stripped.find("}}\n{%"), 5, "-}}\n{%");
  EXPECT_TRUE(ParseChatTemplate(stripped).ok()) << stripped;
  EXPECT_TRUE(
      ParseChatTemplate("  {% if x %}\n" + std::string(kPlainChatMl) + "{% endif %}\n").ok());

  // Llama 3.1's system turn carries the date.
  std::string llama31 = std::string(kLlama3);
  llama31.insert(0, "{{- 'Cutting Knowledge Date: December 2023\\n' }}");
  EXPECT_NE(RejectionOf(llama31).find("renders the date"), std::string::npos);
  EXPECT_NE(RejectionOf("{{ strftime_now('%d %b %Y') }}" + std::string(kPlainChatMl))
                .find("renders the date"),
            std::string::npos);
  // A generation prompt that opens a reasoning block (QwQ style) is not ChatML's.
  std::string thinking = std::string(kPlainChatMl);
  thinking.replace(thinking.find("assistant\n"), 10, "assistant\n<think>\n");
  EXPECT_NE(RejectionOf(thinking).find("neither ChatML nor Llama 3"), std::string::npos);
  // ChatML that trims the content is not what we render.
  std::string trimming = std::string(kPlainChatMl);
  trimming.replace(trimming.find("message['content']"), 18, "message['content'] | trim");
  EXPECT_NE(RejectionOf(trimming).find("neither ChatML nor Llama 3"), std::string::npos);
  // Two different default systems.
  EXPECT_NE(RejectionOf("{% if a %}{{ '<|im_start|>system\nA<|im_end|>\n' }}{% else %}"
                        "{{ '<|im_start|>system\nB<|im_end|>\n' }}{% endif %}" +
                        std::string(kPlainChatMl))
                .find("has two default system turns"),
            std::string::npos);
}

class HfChatTemplateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("vtoken_chat_template_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  fs::path dir_;
};

TEST_F(HfChatTemplateTest, ReadsTokenizerConfigOrChatTemplateJinja) {
  nlohmann::json config = {{"chat_template", kLlama3},
                           {"bos_token", {{"content", "<|begin_of_text|>"}, {"lstrip", false}}}};
  Write("tokenizer_config.json", config.dump());
  auto parsed = LoadHfChatTemplate(dir_.string());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->kind, ChatTemplate::Kind::kLlama3);
  EXPECT_EQ(parsed->bos_token, "<|begin_of_text|>");

  config["chat_template"] = {{{"name", "tool_use"}, {"template", "x"}},
                             {{"name", "default"}, {"template", kSmolLm2}}};
  Write("tokenizer_config.json", config.dump());
  parsed = LoadHfChatTemplate(dir_.string());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->kind, ChatTemplate::Kind::kChatMl);

  // chat_template.jinja wins over the config.
  Write("chat_template.jinja", std::string(kQwen2));
  parsed = LoadHfChatTemplate(dir_.string());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->default_system, "You are a helpful assistant.");

  Write("chat_template.jinja", "{{ messages }}");
  parsed = LoadHfChatTemplate(dir_.string());
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().message(), "'" + (dir_ / "chat_template.jinja").string() +
                                           "': chat template is neither ChatML nor Llama 3: "
                                           "{{ messages }}");
}

TEST_F(HfChatTemplateTest, MissingOrMalformed) {
  auto parsed = LoadHfChatTemplate(dir_.string());
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), StatusCode::kNotFound);
  Write("tokenizer_config.json", "{\"chat_template\": ");
  parsed = LoadHfChatTemplate(dir_.string());
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), StatusCode::kDataLoss);
  Write("tokenizer_config.json", "{\"chat_template\": 7}");
  parsed = LoadHfChatTemplate(dir_.string());
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(parsed.status().message().find("chat_template is neither a string nor a list"),
            std::string::npos);
}

}  // namespace
}  // namespace vtoken::model
