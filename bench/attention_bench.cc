// Paged attention throughput at llama-3.2-1b shapes (32 heads, 8 kv heads, head_dim 64):
// decode at depth 2048 and 8192 for f32 and f16 KV, 1 and 2 threads; the quantized codecs
// (bf16, fp8, int8, int4, kivi4, kivi2) at 8192, with K and V apart for int8, int4 and kivi4
// (which side a codec's time goes to); as bytes of KV read per second. Calls cycle through
// enough layers that the KV is never cache-resident, as in a real forward pass, which reads
// each layer's cache once per token.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attention/paged_attention.h"
#include "core/check.h"
#include "core/thread_pool.h"
#include "kv/kv_storage.h"

namespace kvlm {
namespace {

constexpr int kHeads = 32;
constexpr int kKvHeads = 8;
constexpr int kHeadDim = 64;
constexpr int kBlockSize = 16;
constexpr size_t kMinFootprintBytes = size_t{256} << 20;

// One sequence of `depth` tokens in a shuffled block table, copied into enough
// layers that cycling through them misses every cache.
struct BenchCache {
  std::unique_ptr<KvStorage> storage;
  std::vector<int32_t> table;

  BenchCache(int depth, KvType k_type, KvType v_type) {
    const int num_blocks = (depth + kBlockSize - 1) / kBlockSize;
    const KvLayout layout{1, kKvHeads, kHeadDim, kBlockSize};
    const size_t layer_bytes = static_cast<size_t>(num_blocks) * kv_block_bytes(layout, k_type, v_type);
    const int num_layers = static_cast<int>(std::max<size_t>(2, (kMinFootprintBytes + layer_bytes - 1) / layer_bytes));
    auto created = KvStorage::create({num_layers, kKvHeads, kHeadDim, kBlockSize}, k_type, v_type, num_blocks);
    KVLM_CHECK(created.ok(), "{}", created.status().message());
    storage = std::move(created).value();
    table.resize(static_cast<size_t>(num_blocks));
    std::iota(table.begin(), table.end(), 0);
    std::mt19937 rng(1);
    std::shuffle(table.begin(), table.end(), rng);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> k(kKvHeads * kHeadDim), v(k.size());
    for (int b = 0; b < num_blocks; ++b) {
      for (int s = 0; s < kBlockSize; ++s) {
        for (float& x : k) x = normal(rng);
        for (float& x : v) x = normal(rng);
        storage->write_token(0, BlockId(b), s, k.data(), v.data());
      }
      storage->seal_block(0, BlockId(b));  // KIVI: encoded, as outside the residual window
    }
    const size_t k_arena = storage->k_block_bytes() * num_blocks;
    const size_t v_arena = storage->v_block_bytes() * num_blocks;
    for (int l = 1; l < num_layers; ++l) {
      std::memcpy(storage->mutable_k_block(l, BlockId(0)), storage->k_arena(0), k_arena);
      std::memcpy(storage->mutable_v_block(l, BlockId(0)), storage->v_arena(0), v_arena);
    }
  }
};

// Args: depth, K KvType, V KvType, threads, AttentionIsa, num_queries.
void BM_PagedAttention(benchmark::State& state) {
  const int depth = static_cast<int>(state.range(0));
  const KvType k_type = static_cast<KvType>(state.range(1));
  const KvType v_type = static_cast<KvType>(state.range(2));
  const int threads = static_cast<int>(state.range(3));
  const AttentionIsa isa = static_cast<AttentionIsa>(state.range(4));
  const int num_queries = static_cast<int>(state.range(5));
  BenchCache cache(depth, k_type, v_type);
  ThreadPool pool(threads);
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(num_queries) * kHeads * kHeadDim);  // [num_queries, heads, head_dim]
  for (float& x : q) x = normal(rng);
  std::vector<float> out(q.size());  // [num_queries, heads, head_dim]

  PagedAttentionArgs args;
  args.storage = cache.storage.get();
  args.block_table = cache.table.data();
  args.num_table_blocks = static_cast<int>(cache.table.size());
  args.num_context_tokens = depth;
  args.num_queries = num_queries;
  args.num_heads = kHeads;
  args.q = q.data();
  args.out = out.data();
  args.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  const int num_layers = cache.storage->layout().num_layers;
  int layer = 0;
  for (auto _ : state) {
    args.layer = layer;
    paged_attention(args, pool, isa);
    benchmark::DoNotOptimize(out.data());
    layer = layer + 1 == num_layers ? 0 : layer + 1;
  }
  const size_t kv_bytes_per_call =
      static_cast<size_t>(depth) * (cache.storage->k_block_bytes() + cache.storage->v_block_bytes()) / kBlockSize;
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kv_bytes_per_call));
  const std::string types = k_type == v_type ? std::string(kv_type_name(k_type))
                                             : fmt::format("{}/{}", kv_type_name(k_type), kv_type_name(v_type));
  state.SetLabel(fmt::format("{} {} kv {:.1f} MiB/call", types,
                             attention_isa_name(resolve_attention_isa(isa, kHeadDim)),
                             static_cast<double>(kv_bytes_per_call) / (1 << 20)));
}

void decode_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"depth", "k", "v", "threads", "isa", "queries"});
  auto add = [b](int depth, KvType k, KvType v, int threads, AttentionIsa isa, int queries) {
    b->Args({depth, static_cast<int64_t>(k), static_cast<int64_t>(v), threads, static_cast<int64_t>(isa), queries});
  };
  for (int depth : {2048, 8192}) {
    for (KvType type : {KvType::kF32, KvType::kF16}) {
      for (int threads : {1, 2}) add(depth, type, type, threads, AttentionIsa::kAuto, 1);
    }
  }
  // Quantized codecs at depth: decode is bound by the bytes it reads, or by decoding them.
  for (KvType type : {KvType::kBf16, KvType::kFp8, KvType::kInt8, KvType::kInt4, KvType::kKivi4, KvType::kKivi2}) {
    add(8192, type, type, 1, AttentionIsa::kAuto, 1);
  }
  for (KvType type : {KvType::kInt8, KvType::kInt4, KvType::kKivi4}) add(8192, type, type, 2, AttentionIsa::kAuto, 1);
  // K and V apart: which side a codec's time goes to.
  for (KvType type : {KvType::kInt8, KvType::kInt4, KvType::kKivi4}) {
    add(8192, type, KvType::kF16, 1, AttentionIsa::kAuto, 1);
    add(8192, KvType::kF16, type, 1, AttentionIsa::kAuto, 1);
  }
  // The narrower kernel families, for comparison.
  for (KvType type : {KvType::kInt8, KvType::kInt4}) add(8192, type, type, 1, AttentionIsa::kAvx2, 1);
  for (AttentionIsa isa : {AttentionIsa::kAvx2, AttentionIsa::kPortable}) {
    add(2048, KvType::kF16, KvType::kF16, 1, isa, 1);
  }
  // A 128-token prefill chunk on top of 1920 cached tokens.
  for (int threads : {1, 2}) add(2048, KvType::kF16, KvType::kF16, threads, AttentionIsa::kAuto, 128);
  for (KvType type : {KvType::kInt8, KvType::kInt4}) add(2048, type, type, 1, AttentionIsa::kAuto, 128);
}

BENCHMARK(BM_PagedAttention)->Apply(decode_args)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
}  // namespace kvlm
