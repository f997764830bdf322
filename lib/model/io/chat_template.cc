#include "lib/model/io/chat_template.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

#include "lib/model/io/pretokenizer.h"

namespace vtoken::model {
namespace {

// A template reduced to what recognition needs: its tags with whitespace dropped outside string
// literals, every literal re-quoted as a JSON string and `x.name` spelled x["name"] (so that 'a'
// and "a", message.role and message['role'] compare equal), and whether any text outside the tags
// survives jinja's whitespace control.
struct CanonicalTemplate {
  std::string code;                   // e.g. {%ifadd_generation_prompt%}{{"<|im_start|>..."}}
  std::vector<std::string> literals;  // Decoded string literals, in order.
  std::set<std::string> names;        // Identifiers outside literals (variables, filters, ...).
  bool renders_text = false;
};

bool IsIdentChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// A literal re-quoted the one way (JSON's), whichever quotes and escapes the template used.
void AppendQuoted(const std::string& s, std::string& out) {
  out += nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Reads the string literal starting at s[i] (a quote); returns its decoded value and moves i past
// it. Escapes as jinja's (Python's) \n \t \r \\ \' \"; others are kept as written.
std::string ReadLiteral(std::string_view s, size_t& i) {
  const char quote = s[i++];
  std::string value;
  while (i < s.size() && s[i] != quote) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      char e = s[i + 1];
      switch (e) {
        case 'n':
          value += '\n';
          break;
        case 't':
          value += '\t';
          break;
        case 'r':
          value += '\r';
          break;
        case '\\':
        case '\'':
        case '"':
          value += e;
          break;
        default:
          value += '\\';
          value += e;
      }
      i += 2;
    } else {
      value += s[i++];
    }
  }
  ++i;  // The closing quote (or the end of an unterminated literal).
  return value;
}

// Appends the canonical form of one tag's content (between its delimiters and whitespace-control
// marks) to `out`.
void CanonicalizeTag(std::string_view content, CanonicalTemplate& t) {
  std::string& out = t.code;
  for (size_t i = 0; i < content.size();) {
    char c = content[i];
    if (c == '\'' || c == '"') {
      t.literals.push_back(ReadLiteral(content, i));
      AppendQuoted(t.literals.back(), out);
    } else if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if ((std::isalpha(static_cast<unsigned char>(c)) || c == '_') &&
               (out.empty() || out.back() != '.')) {
      size_t end = i;
      while (end < content.size() && IsIdentChar(content[end])) ++end;
      t.names.emplace(content.substr(i, end - i));
      out += content.substr(i, end - i);
      i = end;
    } else if (c == '.' && !out.empty() &&
               (IsIdentChar(out.back()) || out.back() == ']' || out.back() == ')') &&
               i + 1 < content.size() &&
               (std::isalpha(static_cast<unsigned char>(content[i + 1])) ||
                content[i + 1] == '_')) {
      size_t end = i + 1;
      while (end < content.size() && IsIdentChar(content[end])) ++end;
      std::string name(content.substr(i + 1, end - i - 1));
      if (end < content.size() && content[end] == '(') {
        out += "." + name;  // A method call stays one.
      } else {
        out += "[";
        AppendQuoted(name, out);
        out += "]";
      }
      i = end;
    } else {
      out += c;
      ++i;
    }
  }
}

// Position of the end delimiter `close` of a tag whose content starts at `from`, skipping string
// literals; npos when the tag is not closed.
size_t FindTagEnd(std::string_view s, size_t from, std::string_view close) {
  for (size_t i = from; i < s.size();) {
    if (s[i] == '\'' || s[i] == '"') {
      ReadLiteral(s, i);
    } else if (s.compare(i, close.size(), close) == 0) {
      return i;
    } else {
      ++i;
    }
  }
  return std::string_view::npos;
}

// Tokenizes `jinja` into text and tags, applies jinja's whitespace control ("-" marks) and Hugging
// Face's trim_blocks / lstrip_blocks to the text, and canonicalizes the tags.
CanonicalTemplate Canonicalize(std::string_view jinja) {
  CanonicalTemplate t;
  std::string pending_text;   // Text since the last tag.
  bool text_at_start = true;  // pending_text starts the template (so it starts a line).
  bool strip_next = false;    // The previous tag ended with "-".
  bool trim_newline = false;  // The previous tag was a block or comment (trim_blocks).
  // Decides whether the text before a tag renders anything. `strip_right`: the tag opens with
  // "-"; `lstrip_line`: it is a block or comment tag without "+" (lstrip_blocks strips the spaces
  // and tabs between it and the start of its line).
  auto flush_text = [&](bool strip_right, bool lstrip_line) {
    const std::string& text = pending_text;
    size_t begin = 0;
    size_t end = text.size();
    if (lstrip_line) {
      size_t newline = text.rfind('\n');
      size_t line_start = newline == std::string::npos ? 0 : newline + 1;
      if ((line_start > 0 || text_at_start) &&
          text.find_first_not_of(" \t", line_start) == std::string::npos) {
        end = line_start;
      }
    }
    if (trim_newline && begin < end && text[begin] == '\n') ++begin;
    auto space = [&](size_t k) { return std::isspace(static_cast<unsigned char>(text[k])); };
    if (strip_next) {
      while (begin < end && space(begin)) ++begin;
    }
    if (strip_right) {
      while (begin < end && space(end - 1)) --end;
    }
    if (begin < end) t.renders_text = true;
    pending_text.clear();
    text_at_start = false;
  };

  size_t i = 0;
  while (i < jinja.size()) {
    size_t open = jinja.find('{', i);
    if (open == std::string_view::npos || open + 1 >= jinja.size()) {
      pending_text.append(jinja.substr(i));
      break;
    }
    char kind = jinja[open + 1];
    if (kind != '{' && kind != '%' && kind != '#') {
      pending_text.append(jinja.substr(i, open + 1 - i));
      i = open + 1;
      continue;
    }
    pending_text.append(jinja.substr(i, open - i));
    size_t content_start = open + 2;
    char mark = content_start < jinja.size() ? jinja[content_start] : '\0';
    if (mark == '-' || mark == '+') ++content_start;
    const bool block = kind == '%' || kind == '#';
    flush_text(/*strip_right=*/mark == '-', /*lstrip_line=*/block && mark != '+');
    const std::string_view close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    size_t end =
        kind == '#' ? jinja.find(close, content_start) : FindTagEnd(jinja, content_start, close);
    if (end == std::string_view::npos) {
      t.renders_text = true;  // An unclosed tag: not a template we can vouch for.
      return t;
    }
    size_t content_end = end;
    strip_next = content_end > content_start && jinja[content_end - 1] == '-';
    if (strip_next || (content_end > content_start && jinja[content_end - 1] == '+')) --content_end;
    trim_newline = block;
    if (kind != '#') {
      t.code += kind == '{' ? "{{" : "{%";
      CanonicalizeTag(jinja.substr(content_start, content_end - content_start), t);
      t.code += kind == '{' ? "}}" : "%}";
    }
    i = end + 2;
  }
  flush_text(/*strip_right=*/false, /*lstrip_line=*/false);
  return t;
}

// The canonical code of a jinja expression (as it appears inside a tag).
std::string CanonicalExpression(std::string_view expression) {
  std::string code = Canonicalize("{{" + std::string(expression) + "}}").code;
  return code.substr(2, code.size() - 4);
}

bool Contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

std::string FirstLine(std::string_view jinja) {
  std::string_view line = jinja.substr(0, jinja.find('\n'));
  if (line.size() <= 80) return std::string(line);
  return std::string(line.substr(0, 77)) + "...";
}

// Python's str.strip(), which jinja's trim filter applies: Unicode whitespace and U+001C..U+001F.
std::string_view TrimPythonWhitespace(std::string_view s) {
  size_t begin = s.size();
  size_t end = 0;
  for (size_t i = 0; i < s.size();) {
    auto [c, len] = DecodeUtf8(s.substr(i));
    if (!IsWhitespace(c) && !(c >= 0x1C && c <= 0x1F)) {
      begin = std::min(begin, i);
      end = i + len;
    }
    i += len;
  }
  return begin < end ? s.substr(begin, end - begin) : std::string_view();
}

constexpr std::string_view kChatMlSystemPrefix = "<|im_start|>system\n";
constexpr std::string_view kChatMlTurnEnd = "<|im_end|>\n";

}  // namespace

StatusOr<ChatTemplate> ParseChatTemplate(std::string_view jinja, std::string_view bos_token) {
  auto unsupported = [&](std::string_view why) {
    return InvalidArgumentError("chat template " + std::string(why) + ": " + FirstLine(jinja));
  };
  const CanonicalTemplate t = Canonicalize(jinja);
  if (t.renders_text) return unsupported("renders text outside its tags");
  for (const char* dated : {"strftime_now", "date_string"}) {
    if (t.names.contains(dated)) return unsupported("renders the date");
  }
  for (const std::string& literal : t.literals) {
    if (Contains(literal, "Cutting Knowledge Date")) return unsupported("renders the date");
  }

  static const std::string kChatMlTurns[] = {
      CanonicalExpression(
          "'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'"),
      CanonicalExpression(
          "'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n'"),
  };
  static const std::string kChatMlPrompt =
      Canonicalize("{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}").code;
  static const std::string kLlama3Turn = CanonicalExpression(
      "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + "
      "message['content'] | trim + '<|eot_id|>'");
  static const std::string kLlama3Prompt =
      Canonicalize(
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
          "{% endif %}")
          .code;

  const bool chatml = Contains(t.code, kChatMlPrompt) &&
                      std::any_of(std::begin(kChatMlTurns), std::end(kChatMlTurns),
                                  [&](const std::string& turn) { return Contains(t.code, turn); });
  const bool llama3 = Contains(t.code, kLlama3Prompt) && Contains(t.code, kLlama3Turn);
  if (chatml == llama3) {
    return unsupported(chatml ? "mixes ChatML and Llama 3" : "is neither ChatML nor Llama 3");
  }

  ChatTemplate out;
  if (llama3) {
    out.kind = ChatTemplate::Kind::kLlama3;
    out.end_of_turn = "<|eot_id|>";
    if (t.names.contains("bos_token")) out.bos_token = bos_token;
    return out;
  }
  out.kind = ChatTemplate::Kind::kChatMl;
  out.end_of_turn = "<|im_end|>";
  for (const std::string& literal : t.literals) {
    if (literal.size() > kChatMlSystemPrefix.size() + kChatMlTurnEnd.size() &&
        literal.starts_with(kChatMlSystemPrefix) && literal.ends_with(kChatMlTurnEnd)) {
      std::string system =
          literal.substr(kChatMlSystemPrefix.size(),
                         literal.size() - kChatMlSystemPrefix.size() - kChatMlTurnEnd.size());
      if (!out.default_system.empty() && out.default_system != system) {
        return unsupported("has two default system turns");
      }
      out.default_system = std::move(system);
    }
  }
  return out;
}

std::string RenderUserTurn(const ChatTemplate& chat_template, std::string_view user) {
  std::string out = chat_template.bos_token;
  switch (chat_template.kind) {
    case ChatTemplate::Kind::kChatMl:
      if (!chat_template.default_system.empty()) {
        out += kChatMlSystemPrefix;
        out += chat_template.default_system;
        out += kChatMlTurnEnd;
      }
      out += "<|im_start|>user\n";
      out += user;
      out += kChatMlTurnEnd;
      out += "<|im_start|>assistant\n";
      break;
    case ChatTemplate::Kind::kLlama3:
      out += "<|start_header_id|>user<|end_header_id|>\n\n";
      out += TrimPythonWhitespace(user);
      out += "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
  }
  return out;
}

StatusOr<ChatTemplate> LoadHfChatTemplate(const std::string& model_dir) {
  namespace fs = std::filesystem;
  using Json = nlohmann::json;
  auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream buffer;
    buffer << in.rdbuf();
    return buffer.str();
  };
  const std::string config_path = model_dir + "/tokenizer_config.json";
  Json config = Json::object();
  if (fs::exists(config_path)) {
    try {
      config = Json::parse(read(config_path));
    } catch (const Json::parse_error& e) {
      return DataLossError("'" + config_path + "': invalid JSON: " + e.what());
    }
    if (!config.is_object()) return DataLossError("'" + config_path + "': not a JSON object");
  }
  std::string bos_token;
  if (auto it = config.find("bos_token"); it != config.end()) {
    if (it->is_string()) {
      bos_token = it->get<std::string>();
    } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
      bos_token = (*it)["content"].get<std::string>();
    } else if (!it->is_null()) {
      return DataLossError("'" + config_path + "': bos_token is neither a string nor {content}");
    }
  }

  std::string source = model_dir + "/chat_template.jinja";
  std::string jinja;
  if (fs::exists(source)) {
    jinja = read(source);
  } else {
    source = config_path;
    auto it = config.find("chat_template");
    if (it == config.end() || it->is_null()) {
      return NotFoundError("'" + model_dir + "': no chat_template.jinja and no chat_template in " +
                           "tokenizer_config.json");
    }
    if (it->is_string()) {
      jinja = it->get<std::string>();
    } else if (it->is_array()) {
      for (const Json& named : *it) {
        if (named.is_object() && named.value("name", "") == "default" &&
            named.contains("template") && named["template"].is_string()) {
          jinja = named["template"].get<std::string>();
        }
      }
      if (jinja.empty()) {
        return NotFoundError("'" + config_path + "': chat_template has no \"default\" entry");
      }
    } else {
      return DataLossError("'" + config_path + "': chat_template is neither a string nor a list");
    }
  }
  StatusOr<ChatTemplate> parsed = ParseChatTemplate(jinja, bos_token);
  if (!parsed.ok()) return InvalidArgumentError("'" + source + "': " + parsed.status().message());
  return parsed;
}

}  // namespace vtoken::model
