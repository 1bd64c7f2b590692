// Shared helpers of the cache tests: block ids as plain ints, for exact expectations.
#pragma once

#include <vector>

#include "cache/kv_cache_manager.h"

namespace kvlm::testing {

inline std::vector<int> values(const std::vector<BlockId>& blocks) {
  std::vector<int> out;
  for (BlockId b : blocks) out.push_back(b.value);
  return out;
}
inline std::vector<int> table_ids(const KvCacheManager& m, SeqId s) {
  const auto& ids = m.table(s).block_ids();
  return {ids.begin(), ids.end()};
}
inline std::vector<int> free_ids(const KvCacheManager& m) { return values(m.pool().free_queue()); }

}  // namespace kvlm::testing
