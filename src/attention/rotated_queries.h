// rotated_queries: queries in the space of a storage that keeps its keys Hadamard-rotated.
#pragma once

#include <vector>

#include "kv/hadamard.h"
#include "kv/kv_storage.h"

namespace kvlm {

// The storage rotates every key head it stores (KvStorage::keys_rotated); attention scores
// (Hq)·(Hk) = q·k, so it rotates its queries the same way. Returns `q` itself when the keys are
// not rotated, else a rotated copy in `scratch`.  q: [num_queries, num_heads, head_dim]
inline const float* queries_for_storage(const KvStorage& storage, const float* q, int num_queries, int num_heads,
                                        std::vector<float>& scratch) {
  if (q == nullptr || !storage.keys_rotated()) return q;
  const int head_dim = storage.layout().head_dim;
  scratch.assign(q, q + static_cast<size_t>(num_queries) * static_cast<size_t>(num_heads) * head_dim);
  hadamard_rotate_heads(scratch.data(), num_queries * num_heads, head_dim);
  return scratch.data();
}

}  // namespace kvlm
