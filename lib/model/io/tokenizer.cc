#include "lib/model/io/tokenizer.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

namespace vtoken::model {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// The bytes a byte-level token string stands for. Code points outside GPT-2's byte alphabet
// (never produced by byte-level training) are kept as their own UTF-8.
std::string ByteLevelDecode(std::string_view token) {
  std::string out;
  while (!token.empty()) {
    auto [c, len] = DecodeUtf8(token);
    if (auto b = UnicodeToByte(c)) {
      out += static_cast<char>(*b);
    } else {
      out += token.substr(0, len);
    }
    token.remove_prefix(len);
  }
  return out;
}

constexpr std::string_view kBosNames[] = {"<|begin_of_text|>", "<s>", "<bos>"};
constexpr std::string_view kEosNames[] = {"<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>"};
constexpr std::string_view kEotNames[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>"};

// ---- tokenizer.json parsing --------------------------------------------------------------------

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

// ---- Tokenizer ---------------------------------------------------------------------------------

struct Tokenizer::Index {
  StringMap<int32_t> token_to_id;  // Vocab tokens (byte-level strings).
  StringMap<int32_t> added_to_id;  // Added tokens by content.
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (a, b) -> (rank, merged).
  std::array<int32_t, 256> byte_id;  // Single-byte token per byte, -1 when missing.
  std::optional<int32_t> unk_id;
  // Added tokens by first byte, longest first, for leftmost-longest matching.
  std::array<std::vector<const AddedToken*>, 256> added_by_first_byte;
};

Tokenizer::Tokenizer(TokenizerSpec spec, std::unique_ptr<Index> index)
    : spec_(std::move(spec)), index_(std::move(index)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

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

StatusOr<Tokenizer> Tokenizer::Create(TokenizerSpec spec) {
  auto index = std::make_unique<Index>();
  int32_t max_id = -1;
  for (const auto& [token, id] : spec.vocab) {
    if (id < 0) return InvalidArgumentError("vocab token '" + token + "' has negative id");
    if (!index->token_to_id.emplace(token, id).second) {
      return InvalidArgumentError("vocab token '" + token + "' appears twice");
    }
    max_id = std::max(max_id, id);
  }
  for (const AddedToken& t : spec.added_tokens) {
    if (t.id < 0 || t.content.empty()) {
      return InvalidArgumentError("added token '" + t.content + "' has a negative id or is empty");
    }
    if (!index->added_to_id.emplace(t.content, t.id).second) {
      return InvalidArgumentError("added token '" + t.content + "' appears twice");
    }
    max_id = std::max(max_id, t.id);
  }

  Tokenizer tok(std::move(spec), std::move(index));
  const TokenizerSpec& s = tok.spec_;
  Index& ix = *tok.index_;
  tok.id_to_bytes_.assign(max_id + 1, "");
  tok.id_used_.assign(max_id + 1, false);
  tok.id_special_.assign(max_id + 1, false);
  for (const auto& [token, id] : s.vocab) {
    if (tok.id_used_[id]) {
      return InvalidArgumentError("id " + std::to_string(id) + " is used twice");
    }
    tok.id_used_[id] = true;
    tok.id_to_bytes_[id] = ByteLevelDecode(token);
  }
  for (const AddedToken& t : s.added_tokens) {
    // GPT-2 lists <|endoftext|> both in the vocab and as an added token; that is consistent.
    auto in_vocab = ix.token_to_id.find(t.content);
    bool same_token = in_vocab != ix.token_to_id.end() && in_vocab->second == t.id;
    if (tok.id_used_[t.id] && !same_token) {
      return InvalidArgumentError("added token '" + t.content + "' reuses id " +
                                  std::to_string(t.id));
    }
    tok.id_used_[t.id] = true;
    tok.id_special_[t.id] = t.special;
    tok.id_to_bytes_[t.id] = t.content;
    ix.added_by_first_byte[static_cast<uint8_t>(t.content[0])].push_back(&t);
  }
  for (auto& list : ix.added_by_first_byte) {
    std::stable_sort(list.begin(), list.end(), [](const AddedToken* a, const AddedToken* b) {
      return a->content.size() > b->content.size();
    });
  }

  for (int b = 0; b < 256; ++b) {
    auto it = ix.token_to_id.find(ByteToUnicode(static_cast<uint8_t>(b)));
    ix.byte_id[b] = it == ix.token_to_id.end() ? -1 : it->second;
  }
  ix.merges.reserve(s.merges.size());
  for (size_t rank = 0; rank < s.merges.size(); ++rank) {
    const auto& [a, b] = s.merges[rank];
    std::string name = "merge " + std::to_string(rank) + " '" + a + " " + b + "'";
    auto ia = ix.token_to_id.find(a);
    auto ib = ix.token_to_id.find(b);
    auto iab = ix.token_to_id.find(a + b);
    if (ia == ix.token_to_id.end()) {
      return InvalidArgumentError(name + ": unknown token '" + a + "'");
    }
    if (ib == ix.token_to_id.end()) {
      return InvalidArgumentError(name + ": unknown token '" + b + "'");
    }
    if (iab == ix.token_to_id.end()) {
      return InvalidArgumentError(name + ": merged token '" + a + b + "' is not in the vocab");
    }
    // A repeated merge keeps its first (lowest) rank, as in Hugging Face.
    ix.merges.emplace(PairKey(ia->second, ib->second),
                      std::pair{static_cast<int32_t>(rank), iab->second});
  }

  if (s.unk_token) {
    auto it = ix.token_to_id.find(*s.unk_token);
    if (it == ix.token_to_id.end()) {
      return InvalidArgumentError("unk_token '" + *s.unk_token + "' is not in the vocab");
    }
    ix.unk_id = it->second;
  }
  if (s.bos_token) {
    tok.template_bos_id_ = tok.TokenId(*s.bos_token);
    if (!tok.template_bos_id_) {
      return InvalidArgumentError("post_processor BOS token '" + *s.bos_token + "' is unknown");
    }
  }
  for (auto [id, what] : {std::pair{s.bos_id, "BOS"}, {s.eos_id, "EOS"}, {s.eot_id, "EOT"}}) {
    if (id && (*id < 0 || *id > max_id || !tok.id_used_[*id])) {
      return InvalidArgumentError(std::string(what) + " id " + std::to_string(*id) +
                                  " names no token");
    }
  }
  auto by_name = [&](std::span<const std::string_view> names) -> std::optional<int32_t> {
    for (std::string_view name : names) {
      if (auto it = ix.added_to_id.find(name); it != ix.added_to_id.end()) return it->second;
    }
    return std::nullopt;
  };
  tok.bos_id_ = s.bos_id               ? s.bos_id
                : tok.template_bos_id_ ? tok.template_bos_id_
                                       : by_name(kBosNames);
  tok.eos_id_ = s.eos_id ? s.eos_id : by_name(kEosNames);
  tok.eot_id_ = s.eot_id ? s.eot_id : by_name(kEotNames);
  return tok;
}

std::optional<int32_t> Tokenizer::TokenId(std::string_view token) const {
  if (auto it = index_->added_to_id.find(token); it != index_->added_to_id.end()) return it->second;
  if (auto it = index_->token_to_id.find(token); it != index_->token_to_id.end()) return it->second;
  return std::nullopt;
}

void Tokenizer::EncodePreToken(std::string_view piece, std::vector<int32_t>& out) const {
  const Index& ix = *index_;
  if (spec_.ignore_merges) {
    auto it = ix.token_to_id.find(ByteLevelEncode(piece));
    if (it != ix.token_to_id.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Symbols form a linked list; a min-heap of candidate merges ordered by (rank, position)
  // reproduces Hugging Face's merge order in O(n log n).
  struct Symbol {
    int32_t id;
    int prev, next;
  };
  std::vector<Symbol> sym;
  sym.reserve(piece.size());
  for (char ch : piece) {
    int32_t id = ix.byte_id[static_cast<uint8_t>(ch)];
    if (id < 0) {
      if (!ix.unk_id) continue;
      id = *ix.unk_id;
    }
    int n = static_cast<int>(sym.size());
    sym.push_back({id, n - 1, n + 1});
  }
  if (sym.empty()) return;
  sym.back().next = -1;

  struct Candidate {
    int32_t rank;
    int pos;    // Left symbol.
    int right;  // Right symbol at the time the candidate was made.
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](int left) {
    if (left < 0 || sym[left].next < 0) return;
    auto it = ix.merges.find(PairKey(sym[left].id, sym[sym[left].next].id));
    if (it != ix.merges.end()) heap.push({it->second.first, left, sym[left].next});
  };
  for (int i = 0; i + 1 < static_cast<int>(sym.size()); ++i) consider(i);

  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    // Stale if the pair was changed by an earlier merge: right neighbor or ids differ.
    if (sym[c.pos].id < 0 || sym[c.pos].next != c.right) continue;
    auto it = ix.merges.find(PairKey(sym[c.pos].id, sym[c.right].id));
    if (it == ix.merges.end() || it->second.first != c.rank) continue;
    sym[c.pos].id = it->second.second;
    sym[c.pos].next = sym[c.right].next;
    if (sym[c.pos].next >= 0) sym[sym[c.pos].next].prev = c.pos;
    sym[c.right].id = -1;
    consider(sym[c.pos].prev);
    consider(c.pos);
  }
  for (int i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  // Pre-tokens repeat a lot in natural text; caching their ids makes BPE cost per distinct word.
  StringMap<std::vector<int32_t>> cache;
  auto encode_segment = [&](std::string_view segment) {
    if (segment.empty()) return;
    std::string prefixed;
    if (spec_.add_prefix_space && segment[0] != ' ') {
      prefixed.reserve(segment.size() + 1);
      prefixed.push_back(' ');
      prefixed.append(segment);
      segment = prefixed;
    }
    for (std::string_view piece : PreTokenize(spec_.pattern, segment)) {
      auto it = cache.find(piece);
      if (it == cache.end()) {
        std::vector<int32_t> piece_ids;
        EncodePreToken(piece, piece_ids);
        it = cache.emplace(std::string(piece), std::move(piece_ids)).first;
      }
      ids.insert(ids.end(), it->second.begin(), it->second.end());
    }
  };

  size_t segment_start = 0;
  for (size_t i = 0; i < text.size();) {
    const AddedToken* match = nullptr;
    for (const AddedToken* t : index_->added_by_first_byte[static_cast<uint8_t>(text[i])]) {
      if ((parse_special || !t->special) && text.compare(i, t->content.size(), t->content) == 0) {
        match = t;
        break;
      }
    }
    if (match == nullptr) {
      ++i;
      continue;
    }
    encode_segment(text.substr(segment_start, i - segment_start));
    ids.push_back(match->id);
    i += match->content.size();
    segment_start = i;
  }
  encode_segment(text.substr(segment_start));
  return ids;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || !id_used_[id]) continue;
    if (skip_special && id_special_[id]) continue;
    out += id_to_bytes_[id];
  }
  return out;
}

std::optional<int32_t> PromptBosId(const Tokenizer* tokenizer, const ModelConfig& config) {
  if (tokenizer != nullptr) return tokenizer->template_bos_id();
  if (config.bos_token_ids.empty()) return std::nullopt;
  return static_cast<int32_t>(config.bos_token_ids.front());
}

StatusOr<std::vector<int64_t>> PromptBosTokenIds(const std::string& model_dir,
                                                 const ModelConfig& config) {
  const std::string path = model_dir + "/tokenizer.json";
  if (!std::filesystem::exists(path)) return config.bos_token_ids;
  VTOKEN_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::Load(path));
  const std::optional<int32_t> bos = PromptBosId(&tokenizer, config);
  if (!bos) return std::vector<int64_t>{};
  return std::vector<int64_t>{*bos};
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
  for (const AddedToken& t : s.added_tokens) {
    if (!index_->token_to_id.contains(t.content)) vocab.emplace_back(t.content, t.id);
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
