#include "model/synth_tensor_generator.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/quantize.h"
#include "core/thread_pool.h"
#include "gguf/gguf_writer.h"

namespace kvlm::synth_internal {
namespace {

// splitmix64's output function: a bijection on 64 bits with full avalanche.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// FNV-1a: a stable 64-bit id for a tensor name, identical on every platform.
uint64_t name_hash(const std::string& name) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001B3ull;
  return h;
}

// Uniform values of a given center and std for one row. The stream starts at a hash of
// (seed, tensor, row), so a row's values do not depend on which thread makes it, or when.
// Only integer arithmetic and one float multiply-add per value: bit-identical everywhere.
class RowGenerator {
 public:
  RowGenerator(uint64_t tensor_seed, int64_t row) : state_(mix64(tensor_seed ^ mix64(static_cast<uint64_t>(row) + 1))) {}

  // n values, center + amplitude * u with u uniform in (-1, 1).
  void fill(float* out, int64_t n, float center, float amplitude) {
    int64_t i = 0;
    for (; i + 1 < n; i += 2) {
      const uint64_t bits = next();
      out[i] = value(center, amplitude, static_cast<uint32_t>(bits >> 40));
      out[i + 1] = value(center, amplitude, static_cast<uint32_t>((bits >> 8) & 0xFFFFFFu));
    }
    if (i < n) out[i] = value(center, amplitude, static_cast<uint32_t>(next() >> 40));
  }

 private:
  uint64_t next() {
    state_ += 0x9E3779B97F4A7C15ull;
    return mix64(state_);
  }
  // 24 random bits to the odd multiples of 2^-24 in (-1, 1), exactly representable as floats.
  static float unit(uint32_t bits24) {
    return (static_cast<float>(static_cast<int32_t>(bits24) - (1 << 23)) + 0.5f) * (1.0f / static_cast<float>(1 << 23));
  }
  // The float product is exact in double, so a fused multiply-add cannot change the result:
  // identical bits on every platform and with any contraction flags.
  static float value(float center, float amplitude, uint32_t bits24) {
    return static_cast<float>(static_cast<double>(center) + static_cast<double>(amplitude) * unit(bits24));
  }
  uint64_t state_;
};

// A uniform distribution on [-a, a] has std a / sqrt(3).
float uniform_amplitude(float std) { return std * std::sqrt(3.0f); }

// Rows per parallel task: ~64k values amortize the dispatch without starving threads.
int64_t min_rows_per_task(int64_t cols) { return std::max<int64_t>(1, (int64_t{1} << 16) / cols); }

}  // namespace

GgmlType SynthTensorGenerator::matrix_type(int64_t cols) const {
  return cols % ggml_type_traits(weight_type_).block_size == 0 ? weight_type_ : GgmlType::kF32;
}

uint64_t SynthTensorGenerator::tensor_seed(const std::string& name) const { return mix64(seed_) ^ name_hash(name); }

void SynthTensorGenerator::matrix(const std::string& name, int64_t rows, int64_t cols, Distribution d) {
  add_rows(name, matrix_type(cols), {cols, rows}, rows, cols, d, tensor_seed(name), {});
}

void SynthTensorGenerator::f32_matrix(const std::string& name, int64_t rows, int64_t cols, Distribution d) {
  add_rows(name, GgmlType::kF32, {cols, rows}, rows, cols, d, tensor_seed(name), {});
}

void SynthTensorGenerator::stacked(const std::string& name, int64_t num_slabs, int64_t rows, int64_t cols,
                                   Distribution d) {
  add_rows(name, matrix_type(cols), {cols, rows, num_slabs}, num_slabs * rows, cols, d, tensor_seed(name), {});
}

void SynthTensorGenerator::vector(const std::string& name, int64_t n, Distribution d) {
  add_rows(name, GgmlType::kF32, {n}, 1, n, d, tensor_seed(name), {});
}

void SynthTensorGenerator::values(const std::string& name, std::vector<float> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  writer_.add_tensor(name, GgmlType::kF32, {n}, [v = std::move(v)](uint8_t* dst, uint64_t num_bytes) {
    std::memcpy(dst, v.data(), num_bytes);
  });
}

void SynthTensorGenerator::split_kv_b(const KvBSplit& s, Distribution d) {
  KVLM_CHECK(s.num_heads > 0 && s.nope_dim > 0 && s.v_dim > 0 && s.kv_lora_rank > 0, "kv_b split {}: heads {} nope {} v {} kv_lora {}",
             s.kv_b_name, s.num_heads, s.nope_dim, s.v_dim, s.kv_lora_rank);
  const uint64_t stream = tensor_seed(s.kv_b_name);
  const int64_t head_rows = s.nope_dim + s.v_dim;  // kv_b rows per head

  // k_b: each head's nope key rows of kv_b, transposed. A task makes whole heads, so each kv_b
  // row is drawn once.
  const GgmlType k_type = matrix_type(s.nope_dim);
  const float amplitude = uniform_amplitude(d.std);
  ThreadPool& pool = pool_;
  writer_.add_tensor(s.k_name, k_type, {s.nope_dim, s.kv_lora_rank, s.num_heads},
                     [&pool, s, stream, head_rows, k_type, d, amplitude](uint8_t* dst, uint64_t /*num_bytes*/) {
                       const uint64_t row_bytes = ggml_row_bytes(k_type, s.nope_dim);
                       pool.parallel_for(s.num_heads, 1, [&](int64_t begin, int64_t end) {
                         std::vector<float> key_rows(static_cast<size_t>(s.nope_dim * s.kv_lora_rank));  // [nope, kv_lora]
                         std::vector<float> row(static_cast<size_t>(s.nope_dim));                       // [nope]
                         for (int64_t h = begin; h < end; ++h) {
                           for (int64_t i = 0; i < s.nope_dim; ++i) {
                             RowGenerator(stream, h * head_rows + i)
                                 .fill(key_rows.data() + i * s.kv_lora_rank, s.kv_lora_rank, d.center, amplitude);
                           }
                           for (int64_t j = 0; j < s.kv_lora_rank; ++j) {
                             for (int64_t i = 0; i < s.nope_dim; ++i) row[i] = key_rows[i * s.kv_lora_rank + j];
                             quantize_row_reference(k_type, row.data(),
                                                    dst + static_cast<uint64_t>(h * s.kv_lora_rank + j) * row_bytes,
                                                    s.nope_dim);
                           }
                         }
                       });
                     });

  // v_b: each head's v value rows of kv_b, as they are.
  std::vector<int64_t> v_rows(static_cast<size_t>(s.num_heads * s.v_dim));
  for (int64_t h = 0; h < s.num_heads; ++h) {
    for (int64_t r = 0; r < s.v_dim; ++r) v_rows[h * s.v_dim + r] = h * head_rows + s.nope_dim + r;
  }
  add_rows(s.v_name, matrix_type(s.kv_lora_rank), {s.kv_lora_rank, s.v_dim, s.num_heads}, s.num_heads * s.v_dim,
           s.kv_lora_rank, d, stream, std::move(v_rows));
}

void SynthTensorGenerator::add_rows(const std::string& name, GgmlType type, std::vector<int64_t> dims, int64_t rows,
                                    int64_t cols, Distribution d, uint64_t stream_seed, std::vector<int64_t> row_map) {
  KVLM_CHECK(row_map.empty() || static_cast<int64_t>(row_map.size()) == rows, "tensor {}: {} mapped rows for {} rows",
             name, row_map.size(), rows);
  const float amplitude = uniform_amplitude(d.std);
  ThreadPool& pool = pool_;
  writer_.add_tensor(name, type, std::move(dims),
                     [&pool, stream_seed, type, rows, cols, d, amplitude, row_map = std::move(row_map)](
                         uint8_t* dst, uint64_t /*num_bytes*/) {
                       const uint64_t row_bytes = ggml_row_bytes(type, cols);
                       pool.parallel_for(rows, min_rows_per_task(cols), [&](int64_t begin, int64_t end) {
                         std::vector<float> row(static_cast<size_t>(cols));  // [cols]
                         for (int64_t r = begin; r < end; ++r) {
                           const int64_t stream_row = row_map.empty() ? r : row_map[static_cast<size_t>(r)];
                           RowGenerator(stream_seed, stream_row).fill(row.data(), cols, d.center, amplitude);
                           quantize_row_reference(type, row.data(), dst + static_cast<uint64_t>(r) * row_bytes, cols);
                         }
                       });
                     });
}

}  // namespace kvlm::synth_internal
