// release_sequence: ends one sequence of a paged cache, in both places that hold something for it.
#pragma once

#include "cache/kv_cache_manager.h"
#include "core/ids.h"
#include "kv/kv_storage.h"

namespace kvlm {

// The cache manager returns the sequence's blocks to the pool; before that, the storage takes
// back the KIVI staging those blocks still hold (a no-op for other codecs). Every owner of a
// sequence ends it here, so neither can be forgotten.
inline void release_sequence(KvCacheManager& cache, KvStorage& storage, SeqId seq) {
  storage.release_blocks(cache.table(seq).block_ids());
  cache.free_sequence(seq);
}

}  // namespace kvlm
