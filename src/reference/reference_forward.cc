#include "reference/reference_forward.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/quantize.h"
#include "reference/reference_mla.h"
#include "reference/reference_ops.h"

namespace kvlm {
namespace {

using reference_internal::matmul_ref;
using reference_internal::rms_norm_ref;
using reference_internal::rope_ref;

// RMSNorm of each head_dim-long head of x (qwen3's q and k norms), in place.
void head_norm_ref(std::vector<double>& x, const std::vector<float>& weight, float eps) {
  if (weight.empty()) return;
  const size_t hd = weight.size();
  for (size_t h = 0; h < x.size() / hd; ++h) {
    double* v = &x[h * hd];
    double ss = 0;
    for (size_t i = 0; i < hd; ++i) ss += v[i] * v[i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(hd) + eps);
    for (size_t i = 0; i < hd; ++i) v[i] = v[i] * inv * weight[i];
  }
}

// Gemma's FFN gate: GELU in its tanh form.
double gelu_tanh_ref(double x) {
  const double kSqrt2OverPi = std::sqrt(2.0 / 3.14159265358979323846);
  return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
}

// The dense FFN: down(act(gate xn) * up xn), act SiLU or (gemma) GELU-tanh.
std::vector<double> dense_ffn_ref(const LlamaLayerWeights& L, const std::vector<double>& xn, int64_t n, bool gelu) {
  std::vector<double> gate = matmul_ref(L.w_gate, xn, n);
  const std::vector<double> up = matmul_ref(L.w_up, xn, n);
  for (size_t i = 0; i < gate.size(); ++i) {
    gate[i] = (gelu ? gelu_tanh_ref(gate[i]) : gate[i] / (1.0 + std::exp(-gate[i]))) * up[i];
  }
  return matmul_ref(L.w_down, gate, n);
}

void add_bias_ref(std::vector<double>& x, const std::vector<float>& bias) {
  if (bias.empty()) return;
  for (size_t i = 0; i < x.size(); ++i) x[i] += bias[i % bias.size()];
}

}  // namespace

std::vector<double> reference_logits(const ModelConfig& c, const LlamaWeights& w, std::span<const TokenId> tokens) {
  return reference_logits(c, w, tokens, ReferenceVisibility{});
}

std::vector<double> reference_logits(const ModelConfig& c, const LlamaWeights& w, std::span<const TokenId> tokens,
                                     const ReferenceVisibility& visibility, std::vector<double>* weight_sums,
                                     int64_t first_weight_query) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t dim = c.dim, hd = c.head_dim, q_dim = c.q_dim(), kv_dim = c.kv_dim();
  std::vector<double> x(static_cast<size_t>(n * dim));  // [n, dim]
  std::vector<float> row(static_cast<size_t>(dim));
  for (int64_t t = 0; t < n; ++t) {
    const TokenId id = tokens[static_cast<size_t>(t)];
    KVLM_CHECK(id >= 0 && id < c.vocab_size, "token {} outside vocab {}", id, c.vocab_size);
    dequantize_row_reference(w.token_embd.type, w.token_embd.data + id * w.token_embd.row_bytes, row.data(), dim);
    std::copy(row.begin(), row.end(), x.begin() + t * dim);
  }
  // Gemma 3's rules: the embedding scaled by sqrt(dim); q·k scaled by query_pre_attn_scalar^-1/2
  // (head_dim, but dim / heads for the 62-layer 27B); attention and FFN outputs normed before
  // the residual add; a GELU gate; local layers see their last `window` positions and rotate
  // with their own base, unscaled.
  const bool gemma3 = c.architecture == "gemma3";
  if (gemma3) {
    for (double& value : x) value *= std::sqrt(static_cast<double>(dim));
  }
  const double query_pre_attn_scalar = gemma3 && c.num_layers == 62 ? static_cast<double>(dim) / c.num_heads : hd;
  const double scale = 1.0 / std::sqrt(query_pre_attn_scalar);
  RopeParams local_rope;
  local_rope.head_dim = c.rope.head_dim;
  local_rope.rotary_dim = c.rope.rotary_dim;
  local_rope.style = c.rope.style;
  local_rope.freq_base = c.local_rope.freq_base;
  if (weight_sums != nullptr) weight_sums->assign(static_cast<size_t>(n), 0.0);
  for (size_t layer = 0; layer < w.layers.size(); ++layer) {
    const LlamaLayerWeights& L = w.layers[layer];
    const bool local = gemma3 && c.sliding_window.window > 0 && c.sliding_window.local_layers[layer] != 0;
    const int64_t window = c.sliding_window.window;
    const RopeParams& rope = local ? local_rope : c.rope;
    std::vector<double> xn = rms_norm_ref(x, L.attn_norm, n, c.rms_eps);
    if (c.is_mla()) {  // deepseek2: expanded MLA, then a dense or MoE FFN
      const std::vector<double> o =
          reference_internal::mla_attention_ref(c, L, xn, n, visibility, weight_sums, first_weight_query);
      for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
      xn = rms_norm_ref(x, L.ffn_norm, n, c.rms_eps);
      std::vector<double> down;
      if (c.moe.is_moe_layer(static_cast<int>(layer))) {
        down = reference_internal::moe_ffn_ref(c, L, xn, n);
      } else {
        down = dense_ffn_ref(L, xn, n, false);
      }
      for (size_t i = 0; i < x.size(); ++i) x[i] += down[i];
      continue;
    }
    std::vector<double> q = matmul_ref(L.wq, xn, n);  // [n, q_dim]
    std::vector<double> k = matmul_ref(L.wk, xn, n);  // [n, kv_dim]
    std::vector<double> v = matmul_ref(L.wv, xn, n);  // [n, kv_dim]
    add_bias_ref(q, L.bq);
    add_bias_ref(k, L.bk);
    add_bias_ref(v, L.bv);
    head_norm_ref(q, L.q_norm, c.rms_eps);
    head_norm_ref(k, L.k_norm, c.rms_eps);
    const std::vector<double> q_unrotated = q;  // for queries rotated at another position
    for (int64_t t = 0; t < n; ++t) {
      for (int h = 0; h < c.num_heads; ++h) rope_ref(rope, &q[static_cast<size_t>(t * q_dim + h * hd)], t);
      for (int h = 0; h < c.num_kv_heads; ++h) rope_ref(rope, &k[static_cast<size_t>(t * kv_dim + h * hd)], t);
    }
    std::vector<double> att(static_cast<size_t>(n * q_dim), 0.0);  // [n, q_dim]
    std::vector<double> scores(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) {
      for (int h = 0; h < c.num_heads; ++h) {
        const int kvh = h / c.group_size();
        const double* qh = &q[static_cast<size_t>(t * q_dim + h * hd)];
        std::vector<double> q_other(static_cast<size_t>(hd));
        double max_score = -INFINITY;
        for (int64_t s = 0; s <= t; ++s) {
          if ((visibility.visible && !visibility.visible(t, s)) || (local && t - s >= window)) {
            scores[static_cast<size_t>(s)] = -INFINITY;
            continue;
          }
          const double* qs = qh;
          const int64_t pos = visibility.query_position ? visibility.query_position(t, s) : t;
          if (pos != t) {
            std::copy_n(&q_unrotated[static_cast<size_t>(t * q_dim + h * hd)], hd, q_other.begin());
            rope_ref(rope, q_other.data(), pos);
            qs = q_other.data();
          }
          const double* ks = &k[static_cast<size_t>(s * kv_dim + kvh * hd)];
          double dot = 0;
          for (int64_t i = 0; i < hd; ++i) dot += qs[i] * ks[i];
          scores[static_cast<size_t>(s)] = dot * scale;
          max_score = std::max(max_score, scores[static_cast<size_t>(s)]);
        }
        KVLM_CHECK(max_score > -INFINITY, "reference: query {} sees no key", t);
        double sum = 0;
        for (int64_t s = 0; s <= t; ++s) sum += (scores[static_cast<size_t>(s)] = std::exp(scores[static_cast<size_t>(s)] - max_score));
        double* out = &att[static_cast<size_t>(t * q_dim + h * hd)];
        for (int64_t s = 0; s <= t; ++s) {
          const double p = scores[static_cast<size_t>(s)] / sum;
          if (p == 0.0) continue;
          if (weight_sums != nullptr && t >= first_weight_query) (*weight_sums)[static_cast<size_t>(s)] += p;
          const double* vs = &v[static_cast<size_t>(s * kv_dim + kvh * hd)];
          for (int64_t i = 0; i < hd; ++i) out[i] += p * vs[i];
        }
      }
    }
    std::vector<double> o = matmul_ref(L.wo, att, n);
    if (gemma3) o = rms_norm_ref(o, L.post_attn_norm, n, c.rms_eps);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    xn = rms_norm_ref(x, L.ffn_norm, n, c.rms_eps);
    std::vector<double> down = dense_ffn_ref(L, xn, n, gemma3);
    if (gemma3) down = rms_norm_ref(down, L.post_ffn_norm, n, c.rms_eps);
    for (size_t i = 0; i < x.size(); ++i) x[i] += down[i];
  }
  const std::vector<double> xn = rms_norm_ref(x, w.output_norm, n, c.rms_eps);
  return matmul_ref(w.output, xn, n);
}

double max_relative_error(std::span<const float> actual, std::span<const double> expected) {
  KVLM_CHECK(actual.size() == expected.size(), "sizes {} vs {}", actual.size(), expected.size());
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(actual[i]) - expected[i]));
    max_ref = std::max(max_ref, std::fabs(expected[i]));
  }
  return max_ref > 0 ? max_diff / max_ref : max_diff;
}

}  // namespace kvlm
