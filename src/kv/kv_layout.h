// KvLayout: the shape of the KV cache (layers, kv heads, head size, tokens per block).
#pragma once

#include <cstddef>

#include "core/status.h"

namespace kvlm {

// The same layout holds for K and V and for every layer: one block id names
// `block_size` token slots in every layer's K and V arena.
struct KvLayout {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;  // tokens per block

  // Values of one token in one layer, for K (or V): [num_kv_heads, head_dim].
  size_t values_per_token() const { return static_cast<size_t>(num_kv_heads) * static_cast<size_t>(head_dim); }
};

// Bad layouts come from model files and flags, so they are an error, not a CHECK.
inline Status validate_kv_layout(const KvLayout& layout) {
  if (layout.num_layers <= 0 || layout.num_kv_heads <= 0 || layout.head_dim <= 0 || layout.block_size <= 0) {
    return Status::errorf("invalid KV layout: num_layers={} num_kv_heads={} head_dim={} block_size={} (all must be > 0)",
                          layout.num_layers, layout.num_kv_heads, layout.head_dim, layout.block_size);
  }
  return Status::ok_status();
}

}  // namespace kvlm
