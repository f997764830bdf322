// Token signals: per-token numbers that depend on nothing but the token's own K and V rows (the
// value norm, a key's L1 norm, ...). A token signal is declared once, in one file
// signals/NAME.cc holding one function and its registration; every backend computes it the same
// way (lib/runner/model_runner.h, ModelRunner::TokenSignals), and a policy reads it by naming it
// (Policy::token_signals in policy.h).
//
// Because a token's K and V never change (a relocation copies them exactly), a token signal is
// computed once per token and KV group, when the policy first sees the token, and kept by the
// evictor with the token's other per-token data: it costs one pass over the new tokens' rows,
// not over the whole cache each step.
//
// Reduction: the function sees one KV row (one layer, one KV head: head_dim floats of K and of
// V); the value of a token in a KV group is the mean over the group's rows (token granularity:
// every layer and KV head; layer: that layer's KV heads; head: that one row), summed per layer
// over its heads, then over layers, in that order.
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

namespace vtoken {

// A token signal's value for one KV row: `key` and `value` are head_dim floats each (the cache's
// rows converted to fp32). Must be a pure function: the same rows give the same bits.
using TokenSignalFn = float (*)(std::span<const float> key, std::span<const float> value);

struct TokenSignalInfo {
  std::string name;  // snake_case; how policies name it.
  std::string doc;   // One line: what it measures.
  std::string source_file;
  TokenSignalFn fn = nullptr;
};

// Adds a token signal to the process-wide registry (static initialization). A name registered
// twice, or one of the attention-pass signals' names (attn, attn_sum, key_norm), is a build error
// reported by exiting with a message naming the files.
bool RegisterTokenSignal(TokenSignalInfo info);

// Every registered token signal, sorted by name.
std::vector<const TokenSignalInfo*> RegisteredTokenSignals();

// The token signal registered as `name`, or NotFound naming it and listing the registered ones.
StatusOr<const TokenSignalInfo*> FindTokenSignal(std::string_view name);

// The functions of `infos`, in order.
std::vector<TokenSignalFn> TokenSignalFns(std::span<const TokenSignalInfo* const> infos);

// Reference reduction of one token's signals over its group's rows (see the file comment), for
// runners and tests: `keys` and `values` hold `layers` x `heads` rows of `head_dim` floats,
// layer-major; writes one value per function to out[j].
void ReduceTokenSignals(std::span<const TokenSignalFn> fns, const float* keys, const float* values,
                        int64_t layers, int64_t heads, int64_t head_dim, float* out);

}  // namespace vtoken

#define VTOKEN_TOKEN_SIGNAL_CONCAT_INNER(a, b) a##b
#define VTOKEN_TOKEN_SIGNAL_CONCAT(a, b) VTOKEN_TOKEN_SIGNAL_CONCAT_INNER(a, b)

// Registers function `fn` (a TokenSignalFn) as token signal `name` with a one-line `doc`, e.g.
//   VTOKEN_REGISTER_TOKEN_SIGNAL(ValueNorm, "value_norm", "L2 norm of the token's value");
#define VTOKEN_REGISTER_TOKEN_SIGNAL(fn, name, doc)                                               \
  [[maybe_unused]] static const bool VTOKEN_TOKEN_SIGNAL_CONCAT(vtoken_token_signal_, __LINE__) = \
      ::vtoken::RegisterTokenSignal(::vtoken::TokenSignalInfo{name, doc, __FILE__, fn})
