// Token signals: per-token numbers computed from the cached K and V rows. A token signal is
// declared once, in one file signals/NAME.cc holding its function(s) and its registration; every
// backend computes it the same way (lib/runner/model_runner.h, ModelRunner::TokenSignals), and a
// policy reads it by naming it (Policy::token_signals in policy.h). Two kinds:
//
// - Absolute (the value norm, ...): a function of the token's own K and V rows alone. Because a
//   token's K and V never change (a relocation copies them exactly), it is computed once per
//   token and KV group, when the policy first sees the token, and kept by the evictor with the
//   token's other per-token data: one pass over the new tokens' rows, not over the cache.
// - Relative (KeyDiff's cosine to the mean key, ...): a function of the token's rows and an
//   anchor, head_dim floats that an anchor function reduces from the rows of every live token of
//   the same KV row (layer, KV head) of the group. The anchor moves as tokens come and go, so a
//   relative signal is computed for every live token each time the policy scores (an eviction
//   step): one pass over the group's live rows per eviction, nothing between evictions.
//   A relative signal may instead give every live token's value of a KV row at once (a set
//   function: for a normalisation over the tokens, such as a softmax), and may read the query
//   statistics the runner keeps for the sequence (QueryMoments: the running mean and covariance
//   of each query head's queries before RoPE, as ExpectedAttention needs).
//
// Reduction: the function sees one KV row (one layer, one KV head: head_dim floats of K and of
// V); the value of a token in a KV group is the mean over the group's rows (token granularity:
// every layer and KV head; layer: that layer's KV heads; head: that one row), summed per layer
// over its heads, then over layers, in that order.
//
// Views: a policy may name a signal NAME@layer or NAME@head instead of NAME (TokenSignalView) to
// get, instead of that mean, one value per layer of the group (the mean over the layer's KV
// heads) or one per KV row (layer-major): columns of a token's values, as many as the group has
// layers or rows (TokenSignalInfo::columns). The rows' values are the same; only the reduction
// differs: the mean of a token's NAME@layer columns is NAME's value up to rounding.
//
// The signals the model computes inside its attention pass (attn, attn_sum, key_norm) are not
// token signals: they are the Policy::signals() bits of policy.h.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lib/core/status.h"
#include "lib/core/types.h"

namespace vtoken {

// A token signal's value for one KV row: `key` and `value` are head_dim floats each (the cache's
// rows converted to fp32); `anchor` is the row's anchor (head_dim floats) for a relative signal,
// empty for an absolute one. Must be a pure function: the same rows give the same bits.
using TokenSignalFn = float (*)(std::span<const float> key, std::span<const float> value,
                                std::span<const float> anchor);
// A relative signal's anchor of one KV row: reduces the `n` live tokens' rows (token i's key at
// keys[i], its value at values[i], head_dim floats each: pointers into the runner's store or a
// dense copy of the live rows) to head_dim floats in `anchor`. An array of rows that no signal of
// the call reads (TokenSignalRows) is null. Must be a pure function of the rows in their order.
using TokenSignalAnchorFn = void (*)(const float* const* keys, const float* const* values,
                                     int64_t n, int64_t head_dim, float* anchor);

// The statistics of the queries that read one KV row, kept by the runner per sequence for a
// signal that reads queries (TokenSignalInfo::queries): over every query the sequence computed
// at positions >= kQueryMomentsFirstPosition (the attention sinks' queries are outliers, which
// kvpress's ExpectedAttentionPress leaves out too), before RoPE.
inline constexpr int64_t kQueryMomentsFirstPosition = 4;
// The last queries the runner keeps per head beside the moments (an observation window, as
// SnapKV's and the engine's obs_window default).
inline constexpr int64_t kQueryWindow = 32;
struct QueryMoments {
  int64_t heads = 0;            // The query heads that read the row (its GQA group), in order.
  int64_t count = 0;            // Queries counted per head; 0: none yet (mean and cov are zeros).
  const float* mean = nullptr;  // [heads][head_dim]: their mean.
  // [heads][head_dim][head_dim]: their covariance, (1 / count) sum (q - mean)(q - mean)^T.
  const float* cov = nullptr;
  // [head_dim / 2]: RoPE's angle per position for channel pair (i, i + head_dim / 2) (the
  // rotate_half convention), scaling included.
  const float* inv_freq = nullptr;
  int64_t next_position = 0;  // The position of the sequence's next token.
  // The sequence's last `recent` queries (at most kQueryWindow, every position counted, sinks
  // too), before RoPE, in no particular order: query j of head h at recent_queries[(h *
  // kQueryWindow + j) * head_dim], computed at position recent_positions[j].
  int64_t recent = 0;
  const float* recent_queries = nullptr;
  const int64_t* recent_positions = nullptr;
};

// The live tokens of one KV row (layer, KV head) as a set function sees them, in logical order.
struct TokenSignalRowSet {
  const float* const* keys = nullptr;    // keys[i]: token i's key (head_dim floats), or null.
  const float* const* values = nullptr;  // Likewise its value.
  const int64_t* positions = nullptr;    // positions[i]: token i's position (increasing).
  int64_t n = 0;
  int64_t head_dim = 0;
  const QueryMoments* queries = nullptr;  // For a signal that reads queries; else null.
};
// A relative signal's values of the n live tokens of one KV row, written to out[0..n). Must be a
// pure function of its inputs.
using TokenSignalSetFn = void (*)(const TokenSignalRowSet& rows, float* out);

// Which tokens a runner's token signals are of (ModelRunner::TokenSignals): their request, their
// KV group and their positions, one per slot (for set functions; empty when no signal of the call
// is one).
struct TokenSignalScope {
  int64_t request = -1;
  int32_t group = 0;
  std::span<const int64_t> positions;
};

// The rows a signal reads: a runner copies (or streams) only those; the others' spans and
// pointers are empty or null.
enum class TokenSignalRows : uint8_t { kKeys = 1, kValues = 2, kKeysAndValues = 3 };

// How a token signal's values over a KV group's rows reach a policy (see the file comment).
enum class TokenSignalView : uint8_t {
  kMean,   // NAME: one value, the mean over the group's rows.
  kLayer,  // NAME@layer: one value per layer of the group, the mean over its KV heads.
  kHead,   // NAME@head: one value per row, layer l's KV head h at column l * heads + h.
};

struct TokenSignalInfo {
  std::string name;  // snake_case; how policies name it.
  std::string doc;   // One line: what it measures.
  std::string source_file;
  TokenSignalFn fn = nullptr;            // Null for a set function's signal.
  TokenSignalAnchorFn anchor = nullptr;  // Null for an absolute signal.
  TokenSignalRows rows = TokenSignalRows::kKeysAndValues;
  TokenSignalSetFn set = nullptr;  // A relative signal's set function (then fn and anchor null).
  bool queries = false;            // The set function reads QueryMoments.
  // A view's entry (FindTokenSignal of NAME@layer or NAME@head): the registered signal's entry
  // with this view and the view's name; kMean for every registered entry.
  TokenSignalView view = TokenSignalView::kMean;

  bool relative() const { return anchor != nullptr || set != nullptr; }
  // Values per token in a KV group whose rows span `layers` layers of `heads` KV heads each
  // (KvGroupRows): 1, layers or layers * heads by the view.
  int64_t columns(int64_t layers, int64_t heads) const {
    return view == TokenSignalView::kMean    ? 1
           : view == TokenSignalView::kLayer ? layers
                                             : layers * heads;
  }
  bool reads_keys() const { return (static_cast<uint8_t>(rows) & 1) != 0; }
  bool reads_values() const { return (static_cast<uint8_t>(rows) & 2) != 0; }
};

// Adds a token signal to the process-wide registry (static initialization). A name registered
// twice, or one of the attention-pass signals' names (attn, attn_sum, key_norm), is a build error
// reported by exiting with a message naming the files.
bool RegisterTokenSignal(TokenSignalInfo info);

// Every registered token signal, sorted by name (views are not listed).
std::vector<const TokenSignalInfo*> RegisteredTokenSignals();

// The token signal registered as `name`, or its view for NAME@layer and NAME@head (an entry that
// lives as long as the process); NotFound naming it and listing the registered ones, or naming
// the views for an unknown suffix.
StatusOr<const TokenSignalInfo*> FindTokenSignal(std::string_view name);

// The layers and KV heads per layer whose rows one KV group of a model with `num_layers` layers
// of `num_kv_heads` KV heads spans: token granularity (num_layers, num_kv_heads), layer (1,
// num_kv_heads), head (1, 1).
struct KvGroupRows {
  int64_t layers = 1;
  int64_t heads = 1;
};
KvGroupRows KvGroupRowsOf(Granularity granularity, int64_t num_layers, int64_t num_kv_heads);

// The values per token of `infos` in such a group: the sum of their columns.
int64_t TokenSignalWidth(std::span<const TokenSignalInfo* const> infos, KvGroupRows rows);

// The signals of `infos` of one kind (relative or absolute), in order.
std::vector<const TokenSignalInfo*> TokenSignalsOfKind(
    std::span<const TokenSignalInfo* const> infos, bool relative);

// The dot product of n floats in a fixed order that compilers vectorise: 8 partial sums over
// strided lanes, then added pairwise. For signals' inner loops (a plain left-to-right sum is
// latency-bound: one add every 4 cycles); the same inputs always give the same bits.
inline float SignalDot(const float* a, const float* b, int64_t n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) lane[j] += a[i + j] * b[i + j];
  }
  for (; i < n; ++i) lane[i % 8] += a[i] * b[i];
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

// Reference reduction of one token's signals (absolute ones and anchored relative ones, not set
// functions) over its group's rows (see the file comment), for runners and tests: `keys` and
// `values` hold `layers` x `heads` rows of `head_dim` floats, layer-major; writes each signal's
// columns (TokenSignalInfo::columns), signal after signal, to out (TokenSignalWidth floats).
// `anchors`: for relative signals, signal j's anchor of row r at anchors + (j * layers * heads +
// r) * head_dim (TokenSignalAnchors); may be null when every signal is absolute.
void ReduceTokenSignals(std::span<const TokenSignalInfo* const> infos, const float* keys,
                        const float* values, int64_t layers, int64_t heads, int64_t head_dim,
                        float* out, const float* anchors = nullptr);

// Reference anchors of `infos` over `n` live tokens whose `rows` KV rows of `head_dim` floats are
// at keys + (i * rows + r) * head_dim (and values likewise): per signal and row, its anchor
// (zeros for an absolute signal or a set function's), in ReduceTokenSignals' layout.
std::vector<float> TokenSignalAnchors(std::span<const TokenSignalInfo* const> infos,
                                      const float* keys, const float* values, int64_t n,
                                      int64_t rows, int64_t head_dim);

}  // namespace vtoken

#define VTOKEN_TOKEN_SIGNAL_CONCAT_INNER(a, b) a##b
#define VTOKEN_TOKEN_SIGNAL_CONCAT(a, b) VTOKEN_TOKEN_SIGNAL_CONCAT_INNER(a, b)

// Registers function `fn` (a TokenSignalFn) as absolute token signal `name` with a one-line
// `doc`, e.g.
//   VTOKEN_REGISTER_TOKEN_SIGNAL(ValueNorm, "value_norm", "L2 norm of the token's value");
#define VTOKEN_REGISTER_TOKEN_SIGNAL(fn, name, doc)                                               \
  [[maybe_unused]] static const bool VTOKEN_TOKEN_SIGNAL_CONCAT(vtoken_token_signal_, __LINE__) = \
      ::vtoken::RegisterTokenSignal(::vtoken::TokenSignalInfo{name, doc, __FILE__, fn, nullptr})

// Registers `fn` with its anchor function `anchor` (a TokenSignalAnchorFn) as relative token
// signal `name` that reads `rows` (a TokenSignalRows: kKeys, kValues or kKeysAndValues).
#define VTOKEN_REGISTER_RELATIVE_TOKEN_SIGNAL(fn, anchor, rows, name, doc)                        \
  [[maybe_unused]] static const bool VTOKEN_TOKEN_SIGNAL_CONCAT(vtoken_token_signal_, __LINE__) = \
      ::vtoken::RegisterTokenSignal(::vtoken::TokenSignalInfo{name, doc, __FILE__, fn, anchor,    \
                                                              ::vtoken::TokenSignalRows::rows})

// Registers set function `set` (a TokenSignalSetFn) as relative token signal `name` that reads
// `rows` (kKeys, kValues or kKeysAndValues) and, when `queries` is true, the query statistics.
#define VTOKEN_REGISTER_SET_TOKEN_SIGNAL(set, rows, queries, name, doc)                           \
  [[maybe_unused]] static const bool VTOKEN_TOKEN_SIGNAL_CONCAT(vtoken_token_signal_, __LINE__) = \
      ::vtoken::RegisterTokenSignal(::vtoken::TokenSignalInfo{                                    \
          name, doc, __FILE__, nullptr, nullptr, ::vtoken::TokenSignalRows::rows, set, queries})
