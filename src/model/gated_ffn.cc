#include "model/gated_ffn.h"

#include "model/scratch_vector.h"
#include "ops/elementwise.h"

namespace kvlm {

void gated_ffn(const WeightMatrix& gate, const WeightMatrix& up, const WeightMatrix& down, FfnActivation activation,
               const float* x, int64_t n, ThreadPool& pool, GatedFfnScratch& s, float* y) {
  const int64_t ffn = gate.rows;
  grow_scratch(s.gate, n * ffn);
  grow_scratch(s.up, n * ffn);
  const MatmulOutput gate_up[] = {{&gate, s.gate.data()}, {&up, s.up.data()}};
  matmul_shared_input(gate_up, x, n, pool);
  if (activation == FfnActivation::kGeluTanh) {
    // GELU's tanh is worth threads; SiLU's product is not.
    pool.parallel_for(n, 4, [&](int64_t begin, int64_t end) {
      float* g = s.gate.data() + begin * ffn;
      gelu_tanh_mul(g, s.up.data() + begin * ffn, g, (end - begin) * ffn);
    });
  } else {
    silu_mul(s.gate.data(), s.up.data(), s.gate.data(), n * ffn);
  }
  matmul(down, s.gate.data(), y, n, pool);
}

}  // namespace kvlm
