// SynthTensorGenerator: the deterministic random tensors of `kvlm synth`, generated row by row at write time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace kvlm {

class GgufWriter;
class ThreadPool;

namespace synth_internal {

// How one tensor's values are drawn: uniform with this center and std.
struct Distribution {
  float center = 0.0f;
  float std = 1.0f;
};

// Adds tensors to a writer; each one's bytes are made when the writer reaches it, in parallel
// rows. A row's values come from a stream seeded by (seed, the tensor's name, row index) alone,
// so the bytes depend neither on the thread count nor on the order tensors are added in.
// Matrices take the weight type when their rows fill whole blocks of it, else stay F32.
class SynthTensorGenerator {
 public:
  SynthTensorGenerator(GgufWriter& writer, ThreadPool& pool, uint64_t seed, GgmlType weight_type)
      : writer_(writer), pool_(pool), seed_(seed), weight_type_(weight_type) {}

  // [rows, cols] row-major, GGUF dims {cols, rows}.
  void matrix(const std::string& name, int64_t rows, int64_t cols, Distribution d);
  // Always F32, whatever the weight type (llama.cpp's quantizers keep e.g. MoE routers F32).
  void f32_matrix(const std::string& name, int64_t rows, int64_t cols, Distribution d);
  // [num_slabs, rows, cols] (one matrix per expert or head), GGUF dims {cols, rows, num_slabs};
  // quantized row by row like a matrix of num_slabs * rows rows, whose stream it is.
  void stacked(const std::string& name, int64_t num_slabs, int64_t rows, int64_t cols, Distribution d);
  // Norm weights and biases: always F32.
  void vector(const std::string& name, int64_t n, Distribution d);
  // Given values (the rope_freqs factors), as F32.
  void values(const std::string& name, std::vector<float> v);

  // The split form of one MLA kv_b matrix: the values of `kv_b_name` — [heads * (nope + v), kv_lora],
  // per head nope key rows then v value rows — drawn exactly as matrix(kv_b_name, ...) would, and written as
  //   k_name  [heads, kv_lora, nope]  k[h][j][i] = kv_b[h * (nope + v) + i][j]  (W_UK_h transposed)
  //   v_name  [heads, v, kv_lora]     v[h][r][j] = kv_b[h * (nope + v) + nope + r][j]
  // so a file with attn_k_b/attn_v_b describes the same model as one with attn_kv_b.
  struct KvBSplit {
    std::string kv_b_name;
    std::string k_name;
    std::string v_name;
    int64_t num_heads = 0;
    int64_t nope_dim = 0;
    int64_t v_dim = 0;
    int64_t kv_lora_rank = 0;
  };
  void split_kv_b(const KvBSplit& split, Distribution d);

 private:
  GgmlType matrix_type(int64_t cols) const;
  uint64_t tensor_seed(const std::string& name) const;
  // Rows [0, rows) of the stream of `stream_name`, mapped: the file's row r holds the stream's row
  // row_map(r) (identity when empty).
  void add_rows(const std::string& name, GgmlType type, std::vector<int64_t> dims, int64_t rows, int64_t cols,
                Distribution d, uint64_t stream_seed, std::vector<int64_t> row_map);

  GgufWriter& writer_;
  ThreadPool& pool_;
  uint64_t seed_;
  GgmlType weight_type_;
};

}  // namespace synth_internal
}  // namespace kvlm
