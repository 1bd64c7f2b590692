#include "model/llama_weights.h"

#include <algorithm>
#include <map>
#include <string>
#include <string_view>

#include <fmt/ranges.h>

#include "core/quantize.h"
#include "gguf/gguf_file.h"
#include "model/llama_gguf_names.h"

namespace kvlm {
namespace {

namespace names = llama_names;

// Collects problems across all tensors so one error lists everything missing or wrong.
class TensorBinder {
 public:
  explicit TensorBinder(const GgufFile& file) : file_(file) {}

  const GgufTensorInfo* find(const std::string& name, std::vector<int64_t> expected_dims) {
    const GgufTensorInfo* t = file_.find_tensor(name);
    if (t == nullptr) {
      missing_.push_back(name);
      return nullptr;
    }
    if (t->dims != expected_dims) {
      problems_.push_back(fmt::format("'{}' has dims [{}], expected [{}]", name, fmt::join(t->dims, ", "),
                                      fmt::join(expected_dims, ", ")));
      return nullptr;
    }
    if (!ggml_type_traits(t->type).supported) {
      unsupported_[ggml_type_name(t->type)].push_back(name);
      return nullptr;
    }
    return t;
  }

  WeightMatrix matrix(const std::string& name, int64_t rows, int64_t cols) {
    const GgufTensorInfo* t = find(name, {cols, rows});
    if (t == nullptr) return {};
    return WeightMatrix{t->type, t->data, rows, cols, ggml_row_bytes(t->type, cols)};
  }

  // Consecutive row ranges of one [sum of rows, cols] tensor, as views (phi3's fused tensors).
  std::vector<WeightMatrix> split_rows(const std::string& name, std::initializer_list<int64_t> rows, int64_t cols) {
    int64_t total = 0;
    for (int64_t r : rows) total += r;
    const WeightMatrix whole = matrix(name, total, cols);
    std::vector<WeightMatrix> parts;
    int64_t first = 0;
    for (int64_t r : rows) {
      if (whole.data == nullptr) {
        parts.push_back({});
        continue;
      }
      parts.push_back(WeightMatrix{whole.type, whole.data + first * whole.row_bytes, r, cols, whole.row_bytes});
      first += r;
    }
    return parts;
  }

  std::vector<float> vector(const std::string& name, int64_t n) {
    const GgufTensorInfo* t = find(name, {n});
    if (t == nullptr) return {};
    std::vector<float> out(static_cast<size_t>(n));
    dequantize_row_reference(t->type, t->data, out.data(), n);
    return out;
  }

  Status status() const {
    if (missing_.empty() && problems_.empty() && unsupported_.empty()) return Status::ok_status();
    std::string msg = fmt::format("{}: cannot load the model:", file_.name());
    if (!missing_.empty()) msg += fmt::format(" missing tensors: {}.", fmt::join(missing_, ", "));
    if (!problems_.empty()) msg += fmt::format(" {}.", fmt::join(problems_, "; "));
    // One clause per type, naming a few tensors: a file of one unsupported type has hundreds.
    for (const auto& [type, tensors] : unsupported_) {
      constexpr size_t kNamed = 3;
      const std::vector<std::string> named(tensors.begin(), tensors.begin() + std::min(kNamed, tensors.size()));
      msg += fmt::format(" weight type {} is not supported by kvlm ({} tensor{}: {}{}).", type, tensors.size(),
                         tensors.size() == 1 ? "" : "s", fmt::join(named, ", "), tensors.size() > kNamed ? ", ..." : "");
    }
    if (!unsupported_.empty()) msg += fmt::format(" kvlm computes with: {}.", supported_ggml_type_names());
    return Status::error(msg);
  }

 private:
  const GgufFile& file_;
  std::vector<std::string> missing_;
  std::vector<std::string> problems_;
  std::map<std::string_view, std::vector<std::string>> unsupported_;  // type name -> tensors
};

uint64_t matrix_bytes(const WeightMatrix& w) { return static_cast<uint64_t>(w.rows) * w.row_bytes; }

}  // namespace

Result<LlamaWeights> LlamaWeights::bind(const GgufFile& file, const ModelConfig& c) {
  TensorBinder b(file);
  LlamaWeights w;
  w.token_embd = b.matrix(names::kTokenEmbd, c.vocab_size, c.dim);
  w.output_norm = b.vector(names::kOutputNorm, c.dim);
  w.output = c.tied_output ? w.token_embd : b.matrix(names::kOutput, c.vocab_size, c.dim);
  w.layers.resize(static_cast<size_t>(c.num_layers));
  for (int l = 0; l < c.num_layers; ++l) {
    LlamaLayerWeights& layer = w.layers[static_cast<size_t>(l)];
    layer.attn_norm = b.vector(names::blk(l, names::kAttnNorm), c.dim);
    if (c.fused_qkv) {
      const std::vector<WeightMatrix> qkv =
          b.split_rows(names::blk(l, names::kAttnQkv), {c.q_dim(), c.kv_dim(), c.kv_dim()}, c.dim);
      layer.wq = qkv[0];
      layer.wk = qkv[1];
      layer.wv = qkv[2];
    } else {
      layer.wq = b.matrix(names::blk(l, names::kAttnQ), c.q_dim(), c.dim);
      layer.wk = b.matrix(names::blk(l, names::kAttnK), c.kv_dim(), c.dim);
      layer.wv = b.matrix(names::blk(l, names::kAttnV), c.kv_dim(), c.dim);
    }
    layer.wo = b.matrix(names::blk(l, names::kAttnOutput), c.dim, c.q_dim());
    if (c.has_qkv_bias) {
      layer.bq = b.vector(names::blk(l, names::kAttnQBias), c.q_dim());
      layer.bk = b.vector(names::blk(l, names::kAttnKBias), c.kv_dim());
      layer.bv = b.vector(names::blk(l, names::kAttnVBias), c.kv_dim());
    }
    if (c.has_qk_norm) {
      layer.q_norm = b.vector(names::blk(l, names::kAttnQNorm), c.head_dim);
      layer.k_norm = b.vector(names::blk(l, names::kAttnKNorm), c.head_dim);
    }
    layer.ffn_norm = b.vector(names::blk(l, names::kFfnNorm), c.dim);
    if (c.has_post_norms) {
      layer.post_attn_norm = b.vector(names::blk(l, names::kAttnPostNorm), c.dim);
      layer.post_ffn_norm = b.vector(names::blk(l, names::kFfnPostNorm), c.dim);
    }
    if (c.fused_gate_up) {
      const std::vector<WeightMatrix> gate_up = b.split_rows(names::blk(l, names::kFfnUp), {c.ffn_dim, c.ffn_dim}, c.dim);
      layer.w_gate = gate_up[0];
      layer.w_up = gate_up[1];
    } else {
      layer.w_gate = b.matrix(names::blk(l, names::kFfnGate), c.ffn_dim, c.dim);
      layer.w_up = b.matrix(names::blk(l, names::kFfnUp), c.ffn_dim, c.dim);
    }
    layer.w_down = b.matrix(names::blk(l, names::kFfnDown), c.dim, c.ffn_dim);
  }
  KVLM_RETURN_IF_ERROR(b.status());
  return w;
}

uint64_t LlamaWeights::decode_weight_bytes() const {
  uint64_t total = matrix_bytes(output);
  for (const LlamaLayerWeights& l : layers) {
    total += matrix_bytes(l.wq) + matrix_bytes(l.wk) + matrix_bytes(l.wv) + matrix_bytes(l.wo) +
             matrix_bytes(l.w_gate) + matrix_bytes(l.w_up) + matrix_bytes(l.w_down);
  }
  return total;
}

}  // namespace kvlm
