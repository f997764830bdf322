// Tokenizer (tokenizer.h) itself: the vocabulary index Create builds from a TokenizerSpec (ids,
// merges, added and special tokens), byte-level BPE encoding through it, and decoding.
#include "lib/model/io/tokenizer.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <functional>
#include <queue>
#include <unordered_map>

namespace vtoken::model {
namespace {

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

}  // namespace

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

}  // namespace vtoken::model
