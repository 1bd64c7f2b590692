#include "attention/reference_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "attention/query_rounding.h"
#include "core/check.h"

namespace kvlm {

std::vector<float> reference_attention(const ReferenceAttentionArgs& a) {
  KVLM_CHECK(a.num_queries >= 1 && a.num_context_tokens >= a.num_queries, "reference_attention: {} queries, {} tokens",
             a.num_queries, a.num_context_tokens);
  KVLM_CHECK(a.num_kv_heads >= 1 && a.num_heads % a.num_kv_heads == 0, "reference_attention: {} heads, {} kv heads",
             a.num_heads, a.num_kv_heads);
  const int first_query_pos = a.num_context_tokens - a.num_queries;
  KVLM_CHECK(a.num_sink_tokens >= 0 && a.window_begin >= 0 && a.window_begin <= first_query_pos,
             "reference_attention: {} sink tokens, window_begin {}, first query at {}", a.num_sink_tokens,
             a.window_begin, first_query_pos);
  const size_t D = static_cast<size_t>(a.head_dim);
  const size_t Dv = static_cast<size_t>(a.value_dim > 0 ? a.value_dim : a.head_dim);
  KVLM_CHECK(a.value_dim >= 0 && (a.v != nullptr || Dv <= D),
             "reference_attention: value_dim {} with head_dim {} (values from the key rows need value_dim <= head_dim)",
             a.value_dim, a.head_dim);
  // A token's value row and the distance between tokens' rows: v's, or the key row's prefix.
  const float* const values = a.v != nullptr ? a.v : a.k;
  const size_t value_stride = a.v != nullptr ? Dv : D;
  const size_t T = static_cast<size_t>(a.num_context_tokens);
  const int group = a.num_heads / a.num_kv_heads;
  std::vector<float> out(static_cast<size_t>(a.num_queries) * a.num_heads * Dv);
  if (a.weights != nullptr) a.weights->assign(static_cast<size_t>(a.num_queries) * a.num_heads * T, 0.0);
  std::vector<double> scores(T);
  std::vector<double> acc(Dv);
  // The query row a score uses, scale applied: exact, or rounded as the kernels round it.
  std::vector<int16_t> rounded(D);
  std::vector<double> q_row(D), q_sink_row(D);
  auto load_row = [&](const float* q, std::vector<double>& out) {
    if (!a.round_queries) {
      for (size_t d = 0; d < D; ++d) out[d] = static_cast<double>(q[d]) * static_cast<double>(a.scale);
      return;
    }
    query_rounding::rounded_query_values(q, a.head_dim, a.scale, rounded.data(), out.data());
  };
  for (int i = 0; i < a.num_queries; ++i) {
    const int pos = first_query_pos + i;
    auto visible = [&](int t) {
      return t <= pos && (t < a.num_sink_tokens || t >= a.window_begin) &&
             (a.sliding_window <= 0 || pos - t < a.sliding_window) &&
             (a.query_first_token == nullptr || t >= a.query_first_token[i]);
    };
    for (int h = 0; h < a.num_heads; ++h) {
      const int kvh = h / group;
      const size_t row = static_cast<size_t>(i) * a.num_heads + h;
      double max_score = -std::numeric_limits<double>::infinity();
      load_row(a.q + row * D, q_row);
      if (a.q_sink != nullptr) load_row(a.q_sink + row * D, q_sink_row);
      for (int t = 0; t <= pos; ++t) {
        if (!visible(t)) continue;
        const bool sink = t < a.num_sink_tokens && a.q_sink != nullptr;
        const std::vector<double>& q = sink ? q_sink_row : q_row;
        const float* k = a.k + (static_cast<size_t>(t) * a.num_kv_heads + kvh) * D;
        double dot = 0.0;
        for (size_t d = 0; d < D; ++d) dot += q[d] * static_cast<double>(k[d]);
        scores[static_cast<size_t>(t)] = dot;
        max_score = std::max(max_score, scores[static_cast<size_t>(t)]);
      }
      double sum = 0.0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int t = 0; t <= pos; ++t) {
        if (!visible(t)) continue;
        // Kept unnormalized until the sum is known.
        const double w = std::exp(scores[static_cast<size_t>(t)] - max_score);
        scores[static_cast<size_t>(t)] = w;
        sum += w;
        const float* v = values + (static_cast<size_t>(t) * a.num_kv_heads + kvh) * value_stride;
        for (size_t d = 0; d < Dv; ++d) acc[d] += w * static_cast<double>(v[d]);
      }
      float* o = out.data() + row * Dv;
      for (size_t d = 0; d < Dv; ++d) o[d] = static_cast<float>(acc[d] / sum);
      if (a.weights != nullptr) {
        double* w = a.weights->data() + row * T;
        for (int t = 0; t <= pos; ++t) {
          if (visible(t)) w[t] = scores[static_cast<size_t>(t)] / sum;
        }
      }
    }
  }
  return out;
}

}  // namespace kvlm
