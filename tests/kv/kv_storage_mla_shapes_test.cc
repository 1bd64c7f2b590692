// The live pool of an MLA model holds (kv_lora_rank + qk_rope_head_dim) values per layer and
// token: DeepSeek-V2-Lite's shapes (27 layers, 512 + 64) in f16 are 31,104 bytes per token.
#include <gtest/gtest.h>

#include "kv/kv_storage.h"

namespace kvlm {
namespace {

TEST(KvStorageMlaShapes, DeepseekV2LiteLatentBytesPerToken) {
  KvLayout layout{27, 1, 512 + 64, 16};
  layout.latent_value_dim = 512;
  auto f16 = KvStorage::create(layout, KvType::kF16, KvType::kF16, 4);
  ASSERT_TRUE(f16.ok()) << f16.status().message();
  EXPECT_EQ((*f16)->bytes_per_token(), 31104u);
  EXPECT_EQ((*f16)->v_block_bytes(), 0u);
  // The MHA cache of the same 16 heads (K 192 + V 128 per head) would be 8.9x larger.
  const KvLayout k_mha{27, 16, 192, 16};
  const KvLayout v_mha{27, 16, 128, 16};
  EXPECT_EQ(27u * (k_mha.values_per_token() + v_mha.values_per_token()) * 2u, 276480u);
  // int8: one code per value and one f16 scale per token and row.
  auto int8 = KvStorage::create(layout, KvType::kInt8, KvType::kInt8, 4);
  ASSERT_TRUE(int8.ok()) << int8.status().message();
  EXPECT_EQ((*int8)->bytes_per_token(), 27u * (576u + 2u));
}

}  // namespace
}  // namespace kvlm
