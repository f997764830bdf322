// Chat templates: recognizes the two prompt formats we render (ChatML and Llama 3) in a model's
// jinja chat template, and renders a single user turn exactly as the template would.
//
// There is no jinja evaluator here. ParseChatTemplate reads the template's tags and string
// literals (with jinja's whitespace control and Hugging Face's trim_blocks / lstrip_blocks) and
// looks for each format's per-message expression and generation prompt; it rejects what would
// render more than we reproduce: text outside the tags, reasoning markup (<think>), Llama 3.1's
// dated system turn. Recognition is by markers, so the tests pin the renderings of the templates
// we know (SmolLM2, Qwen2, Llama 3, a tools-aware ChatML in Qwen2.5's style) against jinja2's.
// A template that passes the markers but renders something else for a lone user turn would be
// rendered wrong: add it to the tests before relying on it.
//
// All functions are pure and thread-safe.
#pragma once

#include <string>
#include <string_view>

#include "lib/core/status.h"

namespace vtoken::model {

struct ChatTemplate {
  enum class Kind {
    kChatMl,  // <|im_start|>ROLE\nCONTENT<|im_end|>\n per message (SmolLM2, Qwen2).
    kLlama3,  // <|start_header_id|>ROLE<|end_header_id|>\n\nTRIMMED CONTENT<|eot_id|>.
  };
  Kind kind = Kind::kChatMl;
  // ChatML: the content of the system turn the template inserts when the first message is not a
  // system message; empty when it inserts none.
  std::string default_system;
  // The text that ends a turn: "<|im_end|>" or "<|eot_id|>" (the tokenizer's eot_id()).
  std::string end_of_turn;
  // The text the template renders first ({{ bos_token }}), or empty when it renders none. A prompt
  // rendered with it already starts with BOS: the engine must not prepend another.
  std::string bos_token;
};

// Recognizes `jinja`. `bos_token` is the tokenizer's BOS text (what the template's bos_token
// variable holds); it is kept only when the template renders it. InvalidArgument, quoting the
// template's first line (at most 80 characters), when it is neither format or renders more.
StatusOr<ChatTemplate> ParseChatTemplate(std::string_view jinja, std::string_view bos_token = "");

// What the template renders for messages=[{"role": "user", "content": user}] with
// add_generation_prompt=True: any BOS and default system turn, the user turn, and the assistant
// header that generation continues from.
std::string RenderUserTurn(const ChatTemplate& chat_template, std::string_view user);

// A Hugging Face model directory's template: `model_dir`/chat_template.jinja if it exists, else
// tokenizer_config.json's "chat_template" (a string, or a list of {name, template} from which
// "default" is taken), with its "bos_token" (a string or {"content": ...}). NotFound when the
// directory has no template, DataLoss for malformed JSON, else ParseChatTemplate's errors; each
// message names the file.
StatusOr<ChatTemplate> LoadHfChatTemplate(const std::string& model_dir);

}  // namespace vtoken::model
