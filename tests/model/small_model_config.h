// The small Llama shape the runtime tests share: 2 layers, 4 query / 2 KV heads (GQA 2) of 12
// dims, a 97-token vocabulary with BOS 1. Random weights of it build in milliseconds.
#pragma once

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

}  // namespace vtoken::model::test_configs
