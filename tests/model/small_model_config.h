// The small Llama shape the runtime tests share: 2 layers, 4 query / 2 KV heads (GQA 2) of 12
// dims, a 97-token vocabulary with BOS 1. Random weights of it build in milliseconds. And
// synthetic engine requests over that vocabulary.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "lib/engine/engine.h"
#include "lib/engine/workload.h"
#include "lib/model/io/hf_config.h"

namespace vtoken::model::test_configs {

inline ModelConfig SmallConfig() {
  ModelConfig c;
  c.vocab_size = 97;
  c.hidden_size = 48;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 12;
  c.max_position_embeddings = 4096;
  c.bos_token_ids = {1};
  return c;
}

// `n` requests for SmallConfig's vocabulary: request i has prompt + growth * i tokens drawn from
// [2, 97) by an LCG seeded with `seed`, and max_tokens outputs.
inline std::vector<engine::Request> Requests(int n, int64_t prompt, int64_t growth,
                                             int64_t max_tokens, uint64_t seed) {
  std::vector<engine::Request> out;
  uint64_t state = seed;
  for (int i = 0; i < n; ++i) {
    engine::Request r;
    r.id = i;
    for (int64_t t = 0; t < prompt + growth * i; ++t) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      r.prompt_tokens.push_back(static_cast<int32_t>(2 + (state >> 33) % 95));
    }
    r.max_tokens = max_tokens;
    out.push_back(std::move(r));
  }
  return out;
}

// The engine the runtime tests drive: H2O keeping 30% (2 sinks, 8 recent), the reclaimer on every
// step, invariants and KV hashes verified, a pool of `num_blocks` blocks of 16.
inline engine::EngineOptions H2oEngineOptions(Mode mode, int32_t num_blocks,
                                              int64_t max_prefill_chunk) {
  engine::EngineOptions o;
  o.mode = mode;
  o.pool = {.num_blocks = num_blocks, .block_size = 16, .headroom_blocks = 8};
  o.reclaim.trigger = ReclaimOptions::Trigger::kAlways;
  o.policy = "h2o";
  o.evictor = {.keep_ratio = 0.3, .num_sink = 2, .num_recent = 8};
  o.max_prefill_chunk = max_prefill_chunk;
  o.verify = true;
  return o;
}

}  // namespace vtoken::model::test_configs
