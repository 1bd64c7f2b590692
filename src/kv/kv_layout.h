// KvLayout: the shape of the KV cache (layers, kv heads, head size, tokens per block).
#pragma once

#include <cstddef>

#include "core/status.h"

namespace kvlm {

// The same layout holds for K and V and for every layer: one block id names
// `block_size` token slots in every layer's K and V arena. A latent layout (MLA) has one arena
// per layer, the rows' (see KvStorage).
struct KvLayout {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;  // tokens per block
  // MLA: one row per token (head_dim values, num_kv_heads must be 1) read as the key, whose first
  // latent_value_dim values are also read as the value; no V arena. 0 = separate K and V rows.
  int latent_value_dim = 0;

  bool is_latent() const { return latent_value_dim > 0; }
  int value_dim() const { return is_latent() ? latent_value_dim : head_dim; }

  // Values of one token in one layer, for K (or V; a latent layout's row): [num_kv_heads, head_dim].
  size_t values_per_token() const { return static_cast<size_t>(num_kv_heads) * static_cast<size_t>(head_dim); }
};

// Bad layouts come from model files and flags, so they are an error, not a CHECK.
inline Status validate_kv_layout(const KvLayout& layout) {
  if (layout.num_layers <= 0 || layout.num_kv_heads <= 0 || layout.head_dim <= 0 || layout.block_size <= 0) {
    return Status::errorf("invalid KV layout: num_layers={} num_kv_heads={} head_dim={} block_size={} (all must be > 0)",
                          layout.num_layers, layout.num_kv_heads, layout.head_dim, layout.block_size);
  }
  if (layout.latent_value_dim < 0) {
    return Status::errorf("invalid KV layout: latent_value_dim={} (must be >= 0; 0 = separate K and V rows)",
                          layout.latent_value_dim);
  }
  if (layout.is_latent() && (layout.num_kv_heads != 1 || layout.latent_value_dim > layout.head_dim)) {
    return Status::errorf(
        "invalid latent KV layout: num_kv_heads={} head_dim={} latent_value_dim={} (a latent row is one kv head, "
        "and its value is a prefix of it: num_kv_heads must be 1 and 0 < latent_value_dim <= head_dim)",
        layout.num_kv_heads, layout.head_dim, layout.latent_value_dim);
  }
  return Status::ok_status();
}

}  // namespace kvlm
