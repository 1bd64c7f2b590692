#include "kv/hadamard.h"

#include <cmath>

#include "core/check.h"

namespace kvlm {

int hadamard_block(int head_dim) {
  KVLM_CHECK(head_dim > 0, "hadamard_block: head_dim {} must be positive", head_dim);
  return head_dim & -head_dim;  // the lowest set bit
}

void hadamard_rotate_heads(float* x, int num_heads, int head_dim) {
  const int b = hadamard_block(head_dim);
  const float norm = 1.0f / std::sqrt(static_cast<float>(b));
  const int num_blocks = num_heads * (head_dim / b);
  for (int blk = 0; blk < num_blocks; ++blk) {
    float* v = x + static_cast<size_t>(blk) * static_cast<size_t>(b);
    // Fast transform: log2(b) butterfly passes of sums and differences.
    for (int h = 1; h < b; h *= 2) {
      for (int i = 0; i < b; i += 2 * h) {
        for (int j = i; j < i + h; ++j) {
          const float a = v[j];
          const float c = v[j + h];
          v[j] = a + c;
          v[j + h] = a - c;
        }
      }
    }
    for (int i = 0; i < b; ++i) v[i] *= norm;
  }
}

}  // namespace kvlm
