// Strong ids: a BlockId cannot be passed where a SeqId is expected.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>

namespace kvlm {

using TokenId = int32_t;  // index into the vocabulary
using Position = int32_t; // position a key was rotated with

template <typename Tag>
struct StrongId {
  int32_t value = -1;
  constexpr StrongId() = default;
  constexpr explicit StrongId(int32_t v) : value(v) {}
  constexpr bool valid() const { return value >= 0; }
  constexpr auto operator<=>(const StrongId&) const = default;
};

using BlockId = StrongId<struct BlockIdTag>;  // a block of the KV pool, addressing all layers
using SeqId = StrongId<struct SeqIdTag>;      // one sequence (request) in the cache

}  // namespace kvlm

template <typename Tag>
struct std::hash<kvlm::StrongId<Tag>> {
  size_t operator()(const kvlm::StrongId<Tag>& id) const noexcept { return std::hash<int32_t>()(id.value); }
};
