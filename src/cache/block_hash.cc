#include "cache/block_hash.h"

// The streaming state lives on the stack (one hash per block, no allocation), which needs
// the state's layout; VersionedState below checks that header and library agree on it.
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "core/check.h"

namespace kvlm {
namespace {

// The hashed bytes are the in-memory bytes of uint64_t and int32_t values; the
// documented encoding is little-endian, so a big-endian host would hash other bytes.
static_assert(std::endian::native == std::endian::little, "block hashes assume a little-endian host");
static_assert(sizeof(TokenId) == 4, "block hashes encode token ids as int32");

// Bumped with any change to the encoding, so roots of two encodings never meet.
constexpr std::string_view kRootTag = "kvlm.prefix_root.v1";

// One XXH3-128 computation fed piece by piece.
class Hasher {
 public:
  Hasher() {
    // The stack state is laid out by the header; a libxxhash of another version would
    // read it differently. Checked once per process.
    static const bool kSameVersion = XXH_versionNumber() == static_cast<unsigned>(XXH_VERSION_NUMBER);
    KVLM_CHECK(kSameVersion, "libxxhash {} does not match the xxhash.h {} it was built against",
               XXH_versionNumber(), XXH_VERSION_NUMBER);
    KVLM_CHECK(XXH3_128bits_reset(&state_) == XXH_OK, "XXH3_128bits_reset failed");
  }

  void update(const void* data, size_t num_bytes) {
    if (num_bytes == 0) return;
    KVLM_CHECK(XXH3_128bits_update(&state_, data, num_bytes) == XXH_OK, "XXH3_128bits_update of {} bytes failed",
               num_bytes);
  }
  void update_u64(uint64_t value) { update(&value, sizeof(value)); }
  void update_string(std::string_view s) {
    update_u64(s.size());
    update(s.data(), s.size());
  }

  BlockHash digest() const {
    const XXH128_hash_t h = XXH3_128bits_digest(&state_);
    return BlockHash{h.low64, h.high64};
  }

 private:
  XXH3_state_t state_;
};

}  // namespace

BlockHash prefix_root_hash(std::string_view cache_identity, std::string_view cache_salt) {
  Hasher h;
  h.update_string(kRootTag);
  h.update_string(cache_identity);
  h.update_string(cache_salt);
  return h.digest();
}

BlockHash chain_block_hash(const BlockHash& parent, std::span<const TokenId> tokens) {
  Hasher h;
  h.update_u64(parent.low);
  h.update_u64(parent.high);
  h.update(tokens.data(), tokens.size_bytes());
  return h.digest();
}

std::vector<BlockHash> chain_block_hashes(const BlockHash& root, std::span<const TokenId> tokens, int block_size) {
  KVLM_CHECK(block_size > 0, "block_size must be > 0, got {}", block_size);
  const size_t b = static_cast<size_t>(block_size);
  const size_t num_full = tokens.size() / b;
  std::vector<BlockHash> hashes;
  hashes.reserve(num_full);
  BlockHash parent = root;
  for (size_t i = 0; i < num_full; ++i) {
    parent = chain_block_hash(parent, tokens.subspan(i * b, b));
    hashes.push_back(parent);
  }
  return hashes;
}

}  // namespace kvlm
