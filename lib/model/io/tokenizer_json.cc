// The tokenizer.json format of Tokenizer (tokenizer.h): Load parses the supported subset into a
// TokenizerSpec, Save writes one back that Hugging Face `tokenizers` reads.
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_set>

#include "lib/model/io/tokenizer.h"

namespace vtoken::model {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// Parses one tokenizer.json; every error message starts with the file name.
class SpecParser {
 public:
  explicit SpecParser(std::string path) : path_(std::move(path)) {}

  StatusOr<TokenizerSpec> Parse(const Json& root) {
    TokenizerSpec spec;
    if (!root.is_object()) return DataLoss("top level is not a JSON object");
    VTOKEN_RETURN_IF_ERROR(ParseModel(Field(root, "model"), spec));
    VTOKEN_RETURN_IF_ERROR(ParseAddedTokens(Field(root, "added_tokens"), spec));
    VTOKEN_RETURN_IF_ERROR(ParseNormalizer(Field(root, "normalizer")));
    VTOKEN_RETURN_IF_ERROR(ParsePreTokenizer(Field(root, "pre_tokenizer"), spec));
    VTOKEN_RETURN_IF_ERROR(ParseDecoder(Field(root, "decoder")));
    VTOKEN_RETURN_IF_ERROR(ParsePostProcessor(Field(root, "post_processor"), spec));
    return spec;
  }

  Status DataLoss(std::string_view what) const {
    return DataLossError("tokenizer '" + path_ + "': " + std::string(what));
  }
  Status Unsupported(std::string_view what) const {
    return InvalidArgumentError("tokenizer '" + path_ + "': " + std::string(what));
  }

 private:
  static const Json& Field(const Json& obj, const char* key) {
    static const Json kNull;
    auto it = obj.find(key);
    return it == obj.end() ? kNull : *it;
  }

  Status ExpectObject(const Json& j, std::string_view name) const {
    if (!j.is_object()) return DataLoss(std::string(name) + " is not an object");
    return Status::Ok();
  }

  StatusOr<std::string> GetString(const Json& obj, const char* key, std::string_view where) const {
    const Json& j = Field(obj, key);
    if (!j.is_string()) return DataLoss(std::string(where) + "." + key + " is not a string");
    return j.get<std::string>();
  }

  StatusOr<bool> GetBool(const Json& obj, const char* key, bool fallback,
                         std::string_view where) const {
    const Json& j = Field(obj, key);
    if (j.is_null()) return fallback;
    if (!j.is_boolean()) return DataLoss(std::string(where) + "." + key + " is not a boolean");
    return j.get<bool>();
  }

  Status ParseModel(const Json& model, TokenizerSpec& spec) const {
    VTOKEN_RETURN_IF_ERROR(ExpectObject(model, "model"));
    const Json& type = Field(model, "type");
    if (!type.is_null() && type != "BPE") {
      return Unsupported("unsupported model type " + type.dump() + " (only BPE)");
    }
    VTOKEN_ASSIGN_OR_RETURN(bool byte_fallback, GetBool(model, "byte_fallback", false, "model"));
    if (byte_fallback) return Unsupported("model.byte_fallback is not supported (byte-level only)");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const Json& j = Field(model, key);
      if (!j.is_null() && j != "") {
        return Unsupported(std::string("model.") + key + " is not supported");
      }
    }
    VTOKEN_ASSIGN_OR_RETURN(spec.ignore_merges, GetBool(model, "ignore_merges", false, "model"));
    const Json& unk = Field(model, "unk_token");
    if (unk.is_string()) {
      spec.unk_token = unk.get<std::string>();
    } else if (!unk.is_null()) {
      return DataLoss("model.unk_token is not a string");
    }

    const Json& vocab = Field(model, "vocab");
    VTOKEN_RETURN_IF_ERROR(ExpectObject(vocab, "model.vocab"));
    spec.vocab.reserve(vocab.size());
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (!it->is_number_integer()) {
        return DataLoss("model.vocab entry '" + it.key() + "' has a non-integer id");
      }
      spec.vocab.emplace_back(it.key(), it->get<int32_t>());
    }

    const Json& merges = Field(model, "merges");
    if (!merges.is_array()) return DataLoss("model.merges is not an array");
    spec.merges.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
      const Json& m = merges[i];
      if (m.is_string()) {
        const std::string& s = m.get_ref<const std::string&>();
        size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
          return DataLoss("model.merges[" + std::to_string(i) + "] '" + s +
                          "' is not two tokens separated by one space");
        }
        spec.merges.emplace_back(s.substr(0, space), s.substr(space + 1));
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        spec.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      } else {
        return DataLoss("model.merges[" + std::to_string(i) +
                        "] is neither \"a b\" nor [\"a\", \"b\"]");
      }
    }
    return Status::Ok();
  }

  Status ParseAddedTokens(const Json& added, TokenizerSpec& spec) const {
    if (added.is_null()) return Status::Ok();
    if (!added.is_array()) return DataLoss("added_tokens is not an array");
    for (size_t i = 0; i < added.size(); ++i) {
      std::string where = "added_tokens[" + std::to_string(i) + "]";
      VTOKEN_RETURN_IF_ERROR(ExpectObject(added[i], where));
      const Json& id = Field(added[i], "id");
      if (!id.is_number_integer()) return DataLoss(where + ".id is not an integer");
      VTOKEN_ASSIGN_OR_RETURN(std::string content, GetString(added[i], "content", where));
      VTOKEN_ASSIGN_OR_RETURN(bool special, GetBool(added[i], "special", false, where));
      spec.added_tokens.push_back({id.get<int32_t>(), std::move(content), special});
    }
    return Status::Ok();
  }

  Status ParseNormalizer(const Json& normalizer) const {
    if (normalizer.is_null()) return Status::Ok();
    VTOKEN_RETURN_IF_ERROR(ExpectObject(normalizer, "normalizer"));
    if (Field(normalizer, "type") == "NFC") return Status::Ok();
    return Unsupported("unsupported normalizer " + Field(normalizer, "type").dump());
  }

  // A ByteLevel pre-tokenizer; `splits` says whether it must (GPT-2 form) or must not (after a
  // Split) run the GPT-2 regex itself.
  Status ParseByteLevel(const Json& bl, bool splits, TokenizerSpec& spec) const {
    VTOKEN_ASSIGN_OR_RETURN(bool use_regex, GetBool(bl, "use_regex", true, "pre_tokenizer"));
    VTOKEN_ASSIGN_OR_RETURN(spec.add_prefix_space,
                            GetBool(bl, "add_prefix_space", false, "pre_tokenizer"));
    if (use_regex != splits) {
      return Unsupported(splits ? "pre_tokenizer ByteLevel without use_regex and without Split"
                                : "pre_tokenizer Split followed by ByteLevel with use_regex");
    }
    if (!splits && spec.add_prefix_space) {
      return Unsupported("pre_tokenizer ByteLevel add_prefix_space after a Split");
    }
    return Status::Ok();
  }

  Status ParseSplit(const Json& split, TokenizerSpec& spec) const {
    const Json& pattern = Field(split, "pattern");
    if (!pattern.is_object() || !Field(pattern, "Regex").is_string()) {
      return Unsupported("pre_tokenizer Split pattern is not a Regex");
    }
    std::string regex = Field(pattern, "Regex").get<std::string>();
    auto known = SplitPatternFromRegex(regex);
    if (!known) return Unsupported("unsupported pre_tokenizer Split regex: " + regex);
    if (Field(split, "behavior") != "Isolated" || Field(split, "invert") == true) {
      return Unsupported("pre_tokenizer Split behavior " + Field(split, "behavior").dump() +
                         " (only Isolated, not inverted)");
    }
    spec.pattern = *known;
    return Status::Ok();
  }

  // Sequence[Digits, ByteLevel(use_regex)]: SmolLM2's digits one by one, then GPT-2's regex.
  Status ParseDigitsThenByteLevel(const Json& digits, const Json& bl, TokenizerSpec& spec) const {
    VTOKEN_ASSIGN_OR_RETURN(bool individual,
                            GetBool(digits, "individual_digits", false, "pre_tokenizer Digits"));
    if (!individual) return Unsupported("pre_tokenizer Digits without individual_digits");
    VTOKEN_RETURN_IF_ERROR(ParseByteLevel(bl, /*splits=*/true, spec));
    // ByteLevel would prepend its space to every piece Digits cut, not to each text segment.
    if (spec.add_prefix_space) {
      return Unsupported("pre_tokenizer ByteLevel add_prefix_space after Digits");
    }
    spec.pattern = SplitPattern::kSmolLm;
    return Status::Ok();
  }

  Status ParsePreTokenizer(const Json& pre, TokenizerSpec& spec) const {
    if (pre.is_null()) return Unsupported("pre_tokenizer is null (byte-level BPE needs ByteLevel)");
    VTOKEN_RETURN_IF_ERROR(ExpectObject(pre, "pre_tokenizer"));
    const Json& type = Field(pre, "type");
    if (type == "ByteLevel") {
      spec.pattern = SplitPattern::kGpt2;
      return ParseByteLevel(pre, /*splits=*/true, spec);
    }
    const Json& steps = Field(pre, "pretokenizers");
    if (type == "Sequence" && steps.is_array() && steps.size() == 2 && steps[0].is_object() &&
        steps[1].is_object() && Field(steps[1], "type") == "ByteLevel") {
      if (Field(steps[0], "type") == "Split") {
        VTOKEN_RETURN_IF_ERROR(ParseSplit(steps[0], spec));
        return ParseByteLevel(steps[1], /*splits=*/false, spec);
      }
      if (Field(steps[0], "type") == "Digits") {
        return ParseDigitsThenByteLevel(steps[0], steps[1], spec);
      }
    }
    return Unsupported("unsupported pre_tokenizer " + type.dump() +
                       " (need ByteLevel, Sequence[Split, ByteLevel] or Sequence[Digits, "
                       "ByteLevel])");
  }

  Status ParseDecoder(const Json& decoder) const {
    if (decoder.is_object() && Field(decoder, "type") == "ByteLevel") return Status::Ok();
    std::string type = decoder.is_object() ? Field(decoder, "type").dump() : decoder.dump();
    return Unsupported("unsupported decoder " + type + " (only ByteLevel)");
  }

  // What the post-processor puts before a single sequence, as Hugging Face applies it: the
  // leading SpecialToken of TemplateProcessing's "single", the "cls" token of RobertaProcessing
  // and BertProcessing; a Sequence applies its processors in order. ByteLevel (offsets only) and
  // null add nothing.
  Status ParsePostProcessor(const Json& post, TokenizerSpec& spec) const {
    if (!post.is_object()) return Status::Ok();
    const Json& type = Field(post, "type");
    if (type == "Sequence" && Field(post, "processors").is_array()) {
      for (const Json& p : Field(post, "processors")) {
        VTOKEN_RETURN_IF_ERROR(ParsePostProcessor(p, spec));
      }
      return Status::Ok();
    }
    if (type == "RobertaProcessing" || type == "BertProcessing") {
      const Json& cls = Field(post, "cls");
      if (!cls.is_array() || cls.empty() || !cls[0].is_string()) {
        return DataLoss("post_processor " + type.get<std::string>() +
                        " needs \"cls\": [token, id]");
      }
      spec.bos_token = cls[0].get<std::string>();
      return Status::Ok();
    }
    if (type != "TemplateProcessing") return Status::Ok();
    const Json& single = Field(post, "single");
    if (!single.is_array() || single.empty() || !single[0].is_object()) return Status::Ok();
    const Json& first = Field(single[0], "SpecialToken");
    if (first.is_object() && Field(first, "id").is_string()) {
      spec.bos_token = Field(first, "id").get<std::string>();
    }
    return Status::Ok();
  }

  std::string path_;
};

}  // namespace

StatusOr<Tokenizer> Tokenizer::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("tokenizer '" + path + "': cannot open file");
  std::stringstream buffer;
  buffer << in.rdbuf();
  SpecParser parser(path);
  Json root;
  try {
    root = Json::parse(buffer.str());
  } catch (const Json::parse_error& e) {
    return parser.DataLoss(std::string("invalid JSON: ") + e.what());
  }
  VTOKEN_ASSIGN_OR_RETURN(TokenizerSpec spec, parser.Parse(root));
  StatusOr<Tokenizer> tokenizer = Create(std::move(spec));
  if (!tokenizer.ok()) return parser.Unsupported(tokenizer.status().message());
  return tokenizer;
}

Status Tokenizer::Save(const std::string& path) const {
  const TokenizerSpec& s = spec_;
  OrderedJson root;
  root["version"] = "1.0";
  root["truncation"] = nullptr;
  root["padding"] = nullptr;
  OrderedJson added = OrderedJson::array();
  for (const AddedToken& t : s.added_tokens) {
    added.push_back({{"id", t.id},
                     {"content", t.content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", t.special}});
  }
  root["added_tokens"] = std::move(added);
  root["normalizer"] = nullptr;

  OrderedJson byte_level = {{"type", "ByteLevel"},
                            {"add_prefix_space", s.add_prefix_space},
                            {"trim_offsets", true},
                            {"use_regex", false}};
  if (s.pattern == SplitPattern::kGpt2 && s.add_prefix_space) {
    byte_level["use_regex"] = true;
    root["pre_tokenizer"] = byte_level;
  } else if (s.pattern == SplitPattern::kSmolLm) {
    byte_level["use_regex"] = true;
    OrderedJson digits = {{"type", "Digits"}, {"individual_digits", true}};
    root["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {digits, byte_level}}};
  } else {
    OrderedJson split = {{"type", "Split"},
                         {"pattern", {{"Regex", std::string(SplitPatternRegex(s.pattern))}}},
                         {"behavior", "Isolated"},
                         {"invert", false}};
    root["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {split, byte_level}}};
  }

  if (s.bos_token) {
    OrderedJson bos = {{"SpecialToken", {{"id", *s.bos_token}, {"type_id", 0}}}};
    OrderedJson a = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
    OrderedJson b = {{"Sequence", {{"id", "B"}, {"type_id", 1}}}};
    root["post_processor"] = {
        {"type", "TemplateProcessing"},
        {"single", {bos, a}},
        {"pair", {bos, a, bos, b}},
        {"special_tokens",
         {{*s.bos_token,
           {{"id", *s.bos_token}, {"ids", {*template_bos_id_}}, {"tokens", {*s.bos_token}}}}}}};
  } else {
    root["post_processor"] = nullptr;
  }
  root["decoder"] = {{"type", "ByteLevel"},
                     {"add_prefix_space", true},
                     {"trim_offsets", true},
                     {"use_regex", true}};

  OrderedJson model;
  model["type"] = "BPE";
  model["dropout"] = nullptr;
  model["unk_token"] = s.unk_token ? OrderedJson(*s.unk_token) : OrderedJson(nullptr);
  model["continuing_subword_prefix"] = nullptr;
  model["end_of_word_suffix"] = nullptr;
  model["fuse_unk"] = false;
  model["byte_fallback"] = false;
  model["ignore_merges"] = s.ignore_merges;
  // Hugging Face gives an added token missing from the model's vocab a new id after the vocab,
  // whatever its "id" says; listed in the vocab too (as its tokenizer.json files do), it keeps it.
  std::vector<std::pair<std::string, int32_t>> vocab = s.vocab;
  std::unordered_set<std::string_view> in_vocab;
  for (const auto& [token, id] : s.vocab) in_vocab.insert(token);
  for (const AddedToken& t : s.added_tokens) {
    if (!in_vocab.contains(t.content)) vocab.emplace_back(t.content, t.id);
  }
  std::sort(vocab.begin(), vocab.end(),
            [](const auto& x, const auto& y) { return x.second < y.second; });
  OrderedJson vocab_json = OrderedJson::object();
  for (const auto& [token, id] : vocab) vocab_json[token] = id;
  model["vocab"] = std::move(vocab_json);
  // "a b" strings are readable by every tokenizers version; arrays only when a token has a space.
  bool any_space = std::any_of(s.merges.begin(), s.merges.end(), [](const auto& m) {
    return m.first.find(' ') != std::string::npos || m.second.find(' ') != std::string::npos;
  });
  OrderedJson merges = OrderedJson::array();
  for (const auto& [a, b] : s.merges) {
    merges.push_back(any_space ? OrderedJson::array({a, b}) : OrderedJson(a + " " + b));
  }
  model["merges"] = std::move(merges);
  root["model"] = std::move(model);

  std::string text;
  try {
    text = root.dump(2);
  } catch (const OrderedJson::type_error& e) {
    return InvalidArgumentError("tokenizer '" + path + "': cannot serialize: " + e.what());
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text << '\n';
  out.close();
  if (!out) return NotFoundError("tokenizer '" + path + "': cannot write file");
  return Status::Ok();
}

}  // namespace vtoken::model
