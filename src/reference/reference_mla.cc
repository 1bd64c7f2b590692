#include "reference/reference_mla.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "core/quantize.h"
#include "reference/reference_ops.h"

namespace kvlm::reference_internal {
namespace {

// Row r of a weight matrix, dequantized by the reference's own code.
std::vector<float> weight_row(const WeightMatrix& w, int64_t r) {
  std::vector<float> row(static_cast<size_t>(w.cols));
  dequantize_row_reference(w.type, w.data + r * w.row_bytes, row.data(), w.cols);
  return row;
}

// The expanded keys' nope parts and the values of every head, from the latents c [n, kv_lora]:
// k_nope [n, heads, nope], v [n, heads, v], from attn_kv_b or from attn_k_b / attn_v_b as stored.
void expand_latents(const ModelConfig& cfg, const LlamaLayerWeights& w, const std::vector<double>& c, int64_t n,
                    std::vector<double>& k_nope, std::vector<double>& v) {
  const MlaConfig& m = cfg.mla;
  const int64_t heads = cfg.num_heads, nope = m.qk_nope_dim, vd = m.v_head_dim, r = m.kv_lora_rank;
  k_nope.assign(static_cast<size_t>(n * heads * nope), 0.0);
  v.assign(static_cast<size_t>(n * heads * vd), 0.0);
  if (w.kv_b.data != nullptr) {
    const std::vector<double> kv = matmul_ref(w.kv_b, c, n);  // [n, heads * (nope + v)]
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const double* src = &kv[static_cast<size_t>((t * heads + h) * (nope + vd))];
        std::copy_n(src, nope, &k_nope[static_cast<size_t>((t * heads + h) * nope)]);
        std::copy_n(src + nope, vd, &v[static_cast<size_t>((t * heads + h) * vd)]);
      }
    }
    return;
  }
  // attn_k_b row h·kv_lora + j holds W_UK_h[:, j]: k_nope[t, h, i] = Σ_j W_UK_h[i, j] c[t, j].
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < r; ++j) {
      const std::vector<float> col = weight_row(w.k_b, h * r + j);
      for (int64_t t = 0; t < n; ++t) {
        const double cj = c[static_cast<size_t>(t * r + j)];
        double* dst = &k_nope[static_cast<size_t>((t * heads + h) * nope)];
        for (int64_t i = 0; i < nope; ++i) dst[i] += static_cast<double>(col[static_cast<size_t>(i)]) * cj;
      }
    }
  }
  const std::vector<double> vv = matmul_ref(w.v_b, c, n);  // [n, heads * v]
  std::copy(vv.begin(), vv.end(), v.begin());
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

std::vector<double> mla_attention_ref(const ModelConfig& cfg, const LlamaLayerWeights& w, const std::vector<double>& xn,
                                      int64_t n, const ReferenceVisibility& visibility,
                                      std::vector<double>* weight_sums, int64_t first_weight_query) {
  const MlaConfig& m = cfg.mla;
  const int64_t heads = cfg.num_heads, nope = m.qk_nope_dim, rope = m.qk_rope_dim, qk = nope + rope;
  const int64_t vd = m.v_head_dim, r = m.kv_lora_rank;
  std::vector<double> q;  // [n, heads, qk]
  if (m.q_lora_rank > 0) {
    q = matmul_ref(w.wq, rms_norm_ref(matmul_ref(w.wq_a, xn, n), w.q_a_norm, n, cfg.rms_eps), n);
  } else {
    q = matmul_ref(w.wq, xn, n);
  }
  const std::vector<double> kv_a = matmul_ref(w.wkv_a, xn, n);  // [n, r + rope]
  std::vector<double> latent(static_cast<size_t>(n * r));
  std::vector<double> k_rope(static_cast<size_t>(n * rope));
  for (int64_t t = 0; t < n; ++t) {
    std::copy_n(&kv_a[static_cast<size_t>(t * (r + rope))], r, &latent[static_cast<size_t>(t * r)]);
    std::copy_n(&kv_a[static_cast<size_t>(t * (r + rope) + r)], rope, &k_rope[static_cast<size_t>(t * rope)]);
    rope_ref(cfg.rope, &k_rope[static_cast<size_t>(t * rope)], t);
  }
  latent = rms_norm_ref(latent, w.kv_a_norm, n, cfg.rms_eps);
  std::vector<double> k_nope, v;
  expand_latents(cfg, w, latent, n, k_nope, v);

  const double scale = static_cast<double>(m.yarn_mscale) * m.yarn_mscale / std::sqrt(static_cast<double>(qk));
  std::vector<double> att(static_cast<size_t>(n * heads * vd), 0.0);
  std::vector<double> scores(static_cast<size_t>(n));
  std::vector<double> q_rot(static_cast<size_t>(rope));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const double* qh = &q[static_cast<size_t>((t * heads + h) * qk)];
      double max_score = -INFINITY;
      for (int64_t s = 0; s <= t; ++s) {
        if (visibility.visible && !visibility.visible(t, s)) {
          scores[static_cast<size_t>(s)] = -INFINITY;
          continue;
        }
        const int64_t pos = visibility.query_position ? visibility.query_position(t, s) : t;
        std::copy_n(qh + nope, rope, q_rot.begin());
        rope_ref(cfg.rope, q_rot.data(), pos);
        const double* ks = &k_nope[static_cast<size_t>((s * heads + h) * nope)];
        double dot = 0;
        for (int64_t i = 0; i < nope; ++i) dot += qh[i] * ks[i];
        for (int64_t i = 0; i < rope; ++i) dot += q_rot[static_cast<size_t>(i)] * k_rope[static_cast<size_t>(s * rope + i)];
        scores[static_cast<size_t>(s)] = dot * scale;
        max_score = std::max(max_score, scores[static_cast<size_t>(s)]);
      }
      KVLM_CHECK(max_score > -INFINITY, "reference: query {} sees no key", t);
      double sum = 0;
      for (int64_t s = 0; s <= t; ++s) {
        sum += (scores[static_cast<size_t>(s)] = std::exp(scores[static_cast<size_t>(s)] - max_score));
      }
      double* out = &att[static_cast<size_t>((t * heads + h) * vd)];
      for (int64_t s = 0; s <= t; ++s) {
        const double p = scores[static_cast<size_t>(s)] / sum;
        if (p == 0.0) continue;
        if (weight_sums != nullptr && t >= first_weight_query) (*weight_sums)[static_cast<size_t>(s)] += p;
        const double* vs = &v[static_cast<size_t>((s * heads + h) * vd)];
        for (int64_t i = 0; i < vd; ++i) out[i] += p * vs[i];
      }
    }
  }
  return matmul_ref(w.wo, att, n);
}

std::vector<double> moe_ffn_ref(const ModelConfig& cfg, const LlamaLayerWeights& w, const std::vector<double>& xn,
                                int64_t n) {
  const MoeConfig& e = cfg.moe;
  const int64_t dim = cfg.dim, ne = e.num_experts;
  const std::vector<double> logits = matmul_ref(w.router, xn, n);  // [n, experts]
  std::vector<double> out(static_cast<size_t>(n * dim), 0.0);
  auto ffn = [&](const WeightMatrix& gate, const WeightMatrix& up, const WeightMatrix& down, const std::vector<double>& x,
                 int64_t rows) {
    std::vector<double> g = matmul_ref(gate, x, rows);
    const std::vector<double> u = matmul_ref(up, x, rows);
    for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] * sigmoid(g[i]) * u[i];
    return matmul_ref(down, g, rows);
  };
  if (e.num_shared_experts > 0) out = ffn(w.shared_gate, w.shared_up, w.shared_down, xn, n);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> p(logits.begin() + t * ne, logits.begin() + (t + 1) * ne);
    if (e.gating == ExpertGating::kSoftmax) {
      const double mx = *std::max_element(p.begin(), p.end());
      double sum = 0;
      for (double& x : p) sum += (x = std::exp(x - mx));
      for (double& x : p) x /= sum;
    } else {
      for (double& x : p) x = sigmoid(x);
    }
    std::vector<double> choose = p;
    for (size_t i = 0; i < w.expert_bias.size(); ++i) choose[i] += w.expert_bias[i];
    if (e.num_groups > 1 && e.num_groups_used < e.num_groups) {
      const int64_t per = ne / e.num_groups;
      std::vector<std::pair<double, int>> group_score;
      for (int g = 0; g < e.num_groups; ++g) {
        std::vector<double> members(choose.begin() + g * per, choose.begin() + (g + 1) * per);
        std::sort(members.rbegin(), members.rend());
        group_score.emplace_back(members[0] + (per > 1 ? members[1] : 0.0), g);
      }
      std::stable_sort(group_score.begin(), group_score.end(), [](auto& a, auto& b) { return a.first > b.first; });
      for (int i = e.num_groups_used; i < e.num_groups; ++i) {
        const int g = group_score[static_cast<size_t>(i)].second;
        for (int64_t j = g * per; j < (g + 1) * per; ++j) choose[static_cast<size_t>(j)] = -INFINITY;
      }
    }
    std::vector<int> order(static_cast<size_t>(ne));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return choose[static_cast<size_t>(a)] > choose[static_cast<size_t>(b)]; });
    double total = 0;
    for (int i = 0; i < e.num_experts_used; ++i) total += p[static_cast<size_t>(order[static_cast<size_t>(i)])];
    const std::vector<double> xt(xn.begin() + t * dim, xn.begin() + (t + 1) * dim);
    for (int i = 0; i < e.num_experts_used; ++i) {
      const size_t ex = static_cast<size_t>(order[static_cast<size_t>(i)]);
      double weight = p[ex];
      if (e.normalize_weights) weight /= total;
      weight *= e.weights_scale;
      const std::vector<double> y = ffn(w.exp_gate[ex], w.exp_up[ex], w.exp_down[ex], xt, 1);
      for (int64_t d = 0; d < dim; ++d) out[static_cast<size_t>(t * dim + d)] += weight * y[static_cast<size_t>(d)];
    }
  }
  return out;
}

}  // namespace kvlm::reference_internal
