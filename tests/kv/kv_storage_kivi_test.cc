// KvStorage with quantized codecs: byte accounting, and KIVI's staging and residual window.
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

#include "kv/kv_block_format.h"
#include "kv/kv_storage.h"

namespace kvlm {
namespace {

// bytes_per_token = ceil((K block + V block) × layers / block_size), the block bytes from
// the layout arithmetic of kv_block_format.h.
TEST(KvStorageQuant, BytesPerTokenMatchesTheLayoutArithmetic) {
  for (const KvLayout l : {KvLayout{.num_layers = 5, .num_kv_heads = 4, .head_dim = 8, .block_size = 16},
                           KvLayout{.num_layers = 16, .num_kv_heads = 8, .head_dim = 64, .block_size = 16},
                           KvLayout{.num_layers = 2, .num_kv_heads = 2, .head_dim = 128, .block_size = 1}}) {
    for (KvType k : all_kv_types()) {
      for (KvType v : all_kv_types()) {
        KvStorage s(l, k, v, 2);
        const size_t kb = l.num_kv_heads * kv_format::head_bytes(k, KvRole::kKey, l.head_dim, l.block_size);
        const size_t vb = l.num_kv_heads * kv_format::head_bytes(v, KvRole::kValue, l.head_dim, l.block_size);
        ASSERT_EQ(s.k_block_bytes(), kb);
        ASSERT_EQ(s.v_block_bytes(), vb);
        ASSERT_EQ(s.bytes_per_token(), ((kb + vb) * l.num_layers + l.block_size - 1) / l.block_size);
        ASSERT_EQ(kv_block_bytes(l, k, v), kb + vb);
        ASSERT_EQ(s.staging_bytes(), 0u);
      }
    }
  }
  // llama-3.2-1b, 16-token blocks: f16 32768 B/token; int8 (64 + 2 per head-row) 16896; int4 (32 + 8) 10240.
  const KvLayout llama{.num_layers = 16, .num_kv_heads = 8, .head_dim = 64, .block_size = 16};
  EXPECT_EQ(KvStorage(llama, KvType::kInt8, KvType::kInt8, 1).bytes_per_token(), 16896u);
  EXPECT_EQ(KvStorage(llama, KvType::kInt4, KvType::kInt4, 1).bytes_per_token(), 10240u);
  EXPECT_EQ(KvStorage(llama, KvType::kFp8, KvType::kFp8, 1).bytes_per_token(), 16896u);
  // kivi4: K codes 32 + channel meta 64 × 4 / 16 tokens = 48, V 40; × 2 roles... per head-row.
  EXPECT_EQ(KvStorage(llama, KvType::kKivi4, KvType::kKivi4, 1).bytes_per_token(), 16u * 8 * (48 + 40));
}

const KvLayout kLayout{.num_layers = 2, .num_kv_heads = 2, .head_dim = 8, .block_size = 4};

std::vector<float> token(int t, int kv) {
  std::vector<float> x(kLayout.values_per_token());
  std::mt19937 rng(static_cast<uint32_t>(t * 2 + kv));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& e : x) e = normal(rng);
  return x;
}

// Blocks stay in f32 (exact) while staged; seal_full_blocks encodes the full blocks
// outside the residual window, once, and returns their staging buffers.
TEST(KvStorageKivi, StagesUntilSealedOutsideTheResidualWindow) {
  KvStorage s(kLayout, KvType::kKivi4, KvType::kKivi2, 8, {.kivi_residual_tokens = 5});  // 5 tokens -> 2 blocks
  EXPECT_EQ(s.residual_blocks(), 2);
  const std::vector<int32_t> table = {6, 1, 4, 0, 3};
  const size_t staging_block = 4u * 2 * 8 * sizeof(float);  // [block_size, kv_heads, head_dim] f32
  EXPECT_EQ(s.residual_bytes_per_sequence(), 3u * 2 * 2 * staging_block);  // 3 blocks × layers × roles
  EXPECT_NE(s.k_staged_table(0), nullptr);
  std::vector<float> k(kLayout.values_per_token()), v(k.size());
  for (int t = 0; t < 19; ++t) {
    const BlockId block(table[static_cast<size_t>(t / 4)]);
    for (int layer = 0; layer < 2; ++layer) {
      s.write_token(layer, block, t % 4, token(t, 0).data(), token(t, 1).data());
      s.seal_full_blocks(layer, table.data(), t + 1);
    }
    // Full blocks: (t + 1) / 4; the last two of them and the tail stay staged.
    const int sealed = std::max(0, (t + 1) / 4 - 2);
    for (int i = 0; i <= t / 4; ++i) {
      for (int layer = 0; layer < 2; ++layer) {
        ASSERT_EQ(s.is_staged(layer, BlockId(table[static_cast<size_t>(i)])), i >= sealed) << "t " << t << " i " << i;
      }
    }
    EXPECT_LE(s.staging_bytes(), s.residual_bytes_per_sequence());
  }
  // Staged tokens read back exactly; sealed ones within 4-bit (K) / 2-bit (V) error.
  for (int t = 0; t < 19; ++t) {
    s.read_token(1, BlockId(table[static_cast<size_t>(t / 4)]), t % 4, k.data(), v.data());
    const std::vector<float> k0 = token(t, 0), v0 = token(t, 1);
    const bool staged = t >= 8;
    for (size_t i = 0; i < k.size(); ++i) {
      if (staged) {
        ASSERT_EQ(k[i], k0[i]);
        ASSERT_EQ(v[i], v0[i]);
      } else {
        ASSERT_NEAR(k[i], k0[i], 1.0f);  // range over 4 tokens of N(0,1) / 15 / 2, generously
        ASSERT_NEAR(v[i], v0[i], 2.5f);  // range over 8 values / 3 / 2, generously
      }
    }
  }
  EXPECT_EQ(s.k_staged_table(1)[table[0]], nullptr);
  EXPECT_NE(s.k_staged_table(1)[table[4]], nullptr);
}

// A residual window of 0 seals each block as soon as it is full; the tail stays staged.
TEST(KvStorageKivi, ZeroResidualSealsFullBlocksAtOnce) {
  KvStorage s(kLayout, KvType::kKivi2, KvType::kInt8, 4);
  EXPECT_EQ(s.residual_blocks(), 0);
  EXPECT_EQ(s.v_staged_table(0), nullptr);  // int8 values are encoded per token, never staged
  const std::vector<int32_t> table = {2, 0};
  for (int t = 0; t < 6; ++t) {
    s.write_token(0, BlockId(table[static_cast<size_t>(t / 4)]), t % 4, token(t, 0).data(), token(t, 1).data());
    s.seal_full_blocks(0, table.data(), t + 1);
    EXPECT_EQ(s.is_staged(0, BlockId(2)), t < 3) << t;
  }
  EXPECT_TRUE(s.is_staged(0, BlockId(0)));
  EXPECT_EQ(s.residual_bytes_per_sequence(), 1u * 2 * 1 * 4 * 2 * 8 * sizeof(float));
}

// Writing into a sealed block stages it again with its decoded contents, so the
// other slots keep what they held; resealing encodes the mix.
TEST(KvStorageKivi, RewritingASealedBlockKeepsItsOtherSlots) {
  KvStorage s(kLayout, KvType::kKivi4, KvType::kKivi4, 2);
  std::vector<float> before(4 * kLayout.values_per_token()), after(before.size()), v(kLayout.values_per_token());
  for (int t = 0; t < 4; ++t) s.write_token(0, BlockId(1), t, token(t, 0).data(), token(t, 1).data());
  s.seal_block(0, BlockId(1));
  ASSERT_FALSE(s.is_staged(0, BlockId(1)));
  for (int t = 0; t < 4; ++t) s.read_token(0, BlockId(1), t, before.data() + t * v.size(), v.data());
  const std::vector<float> fresh = token(9, 0);
  s.write_token(0, BlockId(1), 2, fresh.data(), token(9, 1).data());
  EXPECT_TRUE(s.is_staged(0, BlockId(1)));
  for (int t = 0; t < 4; ++t) s.read_token(0, BlockId(1), t, after.data() + t * v.size(), v.data());
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(after[2 * v.size() + i], fresh[i]);
    EXPECT_EQ(after[i], before[i]);
    EXPECT_EQ(after[3 * v.size() + i], before[3 * v.size() + i]);
  }
  // The staging buffer went back to the free list when sealed and was reused.
  EXPECT_EQ(s.staging_bytes(), 2u * 4 * 2 * 8 * sizeof(float));
}

// Sequences that end while blocks are staged give the buffers back (release_blocks), so many
// sequences one after another never hold more staging than one sequence's bound.
TEST(KvStorageKivi, ReleasedSequencesReturnTheirStaging) {
  KvStorage s(kLayout, KvType::kKivi4, KvType::kKivi4, 8, {.kivi_residual_tokens = 4});
  for (int seq = 0; seq < 6; ++seq) {
    // Each sequence takes different block ids, as a FIFO pool hands them out.
    const std::vector<int32_t> table = {(2 * seq) % 8, (2 * seq + 1) % 8};
    for (int t = 0; t < 7; ++t) {
      for (int layer = 0; layer < kLayout.num_layers; ++layer) {
        const std::vector<float> k = token(t, 0), v = token(t, 1);
        s.write_token(layer, BlockId(table[static_cast<size_t>(t / 4)]), t % 4, k.data(), v.data());
        s.seal_full_blocks(layer, table.data(), t + 1);
      }
    }
    EXPECT_LE(s.staging_bytes(), s.residual_bytes_per_sequence()) << "sequence " << seq;
    s.release_blocks(table);
    for (int32_t id : table) EXPECT_FALSE(s.is_staged(0, BlockId(id)));
  }
}

TEST(KvStorageKivi, RejectsNegativeResidual) {
  auto r = KvStorage::create(kLayout, KvType::kKivi4, KvType::kKivi4, 2, {.kivi_residual_tokens = -1});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("residual"), std::string::npos);
}

}  // namespace
}  // namespace kvlm
