#include "attention/reference_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"

namespace kvlm {

std::vector<float> reference_attention(const ReferenceAttentionArgs& a) {
  KVLM_CHECK(a.num_queries >= 1 && a.num_context_tokens >= a.num_queries, "reference_attention: {} queries, {} tokens",
             a.num_queries, a.num_context_tokens);
  KVLM_CHECK(a.num_kv_heads >= 1 && a.num_heads % a.num_kv_heads == 0, "reference_attention: {} heads, {} kv heads",
             a.num_heads, a.num_kv_heads);
  const size_t D = static_cast<size_t>(a.head_dim);
  const int group = a.num_heads / a.num_kv_heads;
  std::vector<float> out(static_cast<size_t>(a.num_queries) * a.num_heads * D);
  std::vector<double> scores(static_cast<size_t>(a.num_context_tokens));
  std::vector<double> acc(D);
  for (int i = 0; i < a.num_queries; ++i) {
    const int visible = a.num_context_tokens - a.num_queries + i + 1;
    for (int h = 0; h < a.num_heads; ++h) {
      const int kvh = h / group;
      const float* q = a.q + (static_cast<size_t>(i) * a.num_heads + h) * D;
      double max_score = -std::numeric_limits<double>::infinity();
      for (int t = 0; t < visible; ++t) {
        const float* k = a.k + (static_cast<size_t>(t) * a.num_kv_heads + kvh) * D;
        double dot = 0.0;
        for (size_t d = 0; d < D; ++d) dot += static_cast<double>(q[d]) * static_cast<double>(k[d]);
        scores[static_cast<size_t>(t)] = dot * static_cast<double>(a.scale);
        max_score = std::max(max_score, scores[static_cast<size_t>(t)]);
      }
      double sum = 0.0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int t = 0; t < visible; ++t) {
        const double w = std::exp(scores[static_cast<size_t>(t)] - max_score);
        sum += w;
        const float* v = a.v + (static_cast<size_t>(t) * a.num_kv_heads + kvh) * D;
        for (size_t d = 0; d < D; ++d) acc[d] += w * static_cast<double>(v[d]);
      }
      float* o = out.data() + (static_cast<size_t>(i) * a.num_heads + h) * D;
      for (size_t d = 0; d < D; ++d) o[d] = static_cast<float>(acc[d] / sum);
    }
  }
  return out;
}

}  // namespace kvlm
