#include "model/moe_ffn.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "model/gated_ffn.h"
#include "model/scratch_vector.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"

namespace kvlm {

void route_token(const MoeConfig& moe, std::span<const float> logits, std::span<const float> bias,
                 std::vector<ExpertChoice>& out) {
  const int e = moe.num_experts;
  KVLM_CHECK(static_cast<int>(logits.size()) == e && (bias.empty() || static_cast<int>(bias.size()) == e),
             "router: {} logits, {} biases for {} experts", logits.size(), bias.size(), e);
  thread_local std::vector<float> probs, select;
  thread_local std::vector<int> order;
  probs.assign(logits.begin(), logits.end());
  if (moe.gating == ExpertGating::kSoftmax) {
    softmax(probs.data(), e);
  } else {
    for (float& p : probs) p = 1.0f / (1.0f + std::exp(-p));
  }
  select = probs;
  if (!bias.empty()) {
    for (int i = 0; i < e; ++i) select[static_cast<size_t>(i)] += bias[static_cast<size_t>(i)];
  }
  if (moe.num_groups > 1 && moe.num_groups_used < moe.num_groups) {
    // Keep the experts of the groups whose two best selection scores sum highest.
    const int per_group = e / moe.num_groups;
    std::vector<std::pair<float, int>> group_scores;
    for (int g = 0; g < moe.num_groups; ++g) {
      std::vector<float> members(select.begin() + g * per_group, select.begin() + (g + 1) * per_group);
      std::partial_sort(members.begin(), members.begin() + std::min(2, per_group), members.end(), std::greater<>());
      float score = members[0];
      if (per_group > 1) score += members[1];
      group_scores.emplace_back(score, g);
    }
    std::stable_sort(group_scores.begin(), group_scores.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<bool> kept(static_cast<size_t>(moe.num_groups), false);
    for (int i = 0; i < moe.num_groups_used; ++i) kept[static_cast<size_t>(group_scores[static_cast<size_t>(i)].second)] = true;
    for (int i = 0; i < e; ++i) {
      if (!kept[static_cast<size_t>(i / per_group)]) select[static_cast<size_t>(i)] = -INFINITY;
    }
  }
  order.resize(static_cast<size_t>(e));
  std::iota(order.begin(), order.end(), 0);
  const int k = moe.num_experts_used;
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
    const float sa = select[static_cast<size_t>(a)];
    const float sb = select[static_cast<size_t>(b)];
    return sa > sb || (sa == sb && a < b);
  });
  out.resize(static_cast<size_t>(k));
  double sum = 0.0;
  for (int i = 0; i < k; ++i) {
    const int expert = order[static_cast<size_t>(i)];
    out[static_cast<size_t>(i)] = {expert, probs[static_cast<size_t>(expert)]};
    sum += probs[static_cast<size_t>(expert)];
  }
  for (ExpertChoice& choice : out) {
    if (moe.normalize_weights) choice.weight = static_cast<float>(choice.weight / sum);
    choice.weight *= moe.weights_scale;
  }
}

void moe_ffn(const ModelConfig& c, const LlamaLayerWeights& w, const float* xn, int64_t n, ThreadPool& pool,
             MoeScratch& s, float* out) {
  const MoeConfig& moe = c.moe;
  const int64_t dim = c.dim;
  grow_scratch(s.logits, n * moe.num_experts);
  matmul(w.router, xn, s.logits.data(), n, pool);
  if (s.choices.size() < static_cast<size_t>(n)) s.choices.resize(static_cast<size_t>(n));
  pool.parallel_for(n, 4, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      route_token(moe, std::span<const float>(s.logits.data() + t * moe.num_experts, static_cast<size_t>(moe.num_experts)),
                  w.expert_bias, s.choices[static_cast<size_t>(t)]);
    }
  });

  // The shared experts see every token: their output starts the sum.
  if (moe.num_shared_experts > 0) {
    gated_ffn(w.shared_gate, w.shared_up, w.shared_down, c.ffn_activation, xn, n, pool, s.ffn, out);
  } else {
    std::fill_n(out, n * dim, 0.0f);
  }
  // Each routed expert runs once over the tokens that chose it, so its weights are read once a step.
  for (int e = 0; e < moe.num_experts; ++e) {
    s.tokens.clear();
    s.weights.clear();
    for (int64_t t = 0; t < n; ++t) {
      for (const ExpertChoice& choice : s.choices[static_cast<size_t>(t)]) {
        if (choice.expert != e) continue;
        s.tokens.push_back(t);
        s.weights.push_back(choice.weight);
      }
    }
    if (s.tokens.empty()) continue;
    const int64_t m = static_cast<int64_t>(s.tokens.size());
    grow_scratch(s.x, m * dim);
    grow_scratch(s.y, m * dim);
    for (int64_t i = 0; i < m; ++i) std::copy_n(xn + s.tokens[static_cast<size_t>(i)] * dim, dim, s.x.data() + i * dim);
    const size_t ei = static_cast<size_t>(e);
    gated_ffn(w.exp_gate[ei], w.exp_up[ei], w.exp_down[ei], c.ffn_activation, s.x.data(), m, pool, s.ffn,
              s.y.data());
    for (int64_t i = 0; i < m; ++i) {
      float* dst = out + s.tokens[static_cast<size_t>(i)] * dim;
      const float* src = s.y.data() + i * dim;
      const float weight = s.weights[static_cast<size_t>(i)];
      for (int64_t d = 0; d < dim; ++d) dst[d] += weight * src[d];
    }
  }
}

}  // namespace kvlm
