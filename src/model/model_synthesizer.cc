#include "model/model_synthesizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/quantize.h"
#include "core/thread_pool.h"
#include "gguf/gguf_file_type.h"
#include "gguf/gguf_writer.h"
#include "model/llama_gguf_names.h"
#include "model/rope_scaling.h"
#include "model/synthetic_vocab.h"

namespace kvlm {
namespace {

namespace names = llama_names;

struct NamedPreset {
  const char* name;
  SynthShape shape;
};

SynthShape make_shape(const char* arch, int layers, int dim, int heads, int kv_heads, int head_dim, int ffn, int vocab,
                      int context, float rope_base, float eps, bool tied, bool qkv_bias) {
  SynthShape s;
  s.architecture = arch;
  s.num_layers = layers;
  s.dim = dim;
  s.num_heads = heads;
  s.num_kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.ffn_dim = ffn;
  s.vocab_size = vocab;
  s.context_length = context;
  s.rope_freq_base = rope_base;
  s.rms_eps = eps;
  s.tied_output = tied;
  s.qkv_bias = qkv_bias;
  return s;
}

// Llama 3.x's RoPE: frequency factors for an 8,192-token original context, as rope_freqs.
SynthShape llama3_scaled(SynthShape s, float factor) {
  s.rope_scaling.type = "llama3";
  s.rope_scaling.factor = factor;
  s.rope_scaling.original_context = 8192;
  return s;
}

SynthShape with_window(SynthShape s, int window) {
  s.sliding_window = window;
  return s;
}

const std::vector<NamedPreset>& presets() {
  static const std::vector<NamedPreset> kPresets = {
      // Real models' shapes (weights are random): the memory and speed of the real thing.
      {"llama-3.2-1b", llama3_scaled(make_shape("llama", 16, 2048, 32, 8, 64, 8192, 128256, 131072, 500000.0f, 1e-5f,
                                                 true, false),
                                      32.0f)},
      {"llama-2-7b", make_shape("llama", 32, 4096, 32, 32, 128, 11008, 32000, 4096, 10000.0f, 1e-5f, false, false)},
      // Tiny models for tests, one per attention kind.
      {"tiny-mha", make_shape("llama", 2, 64, 4, 4, 16, 128, 512, 256, 10000.0f, 1e-5f, true, false)},
      {"tiny-gqa", make_shape("llama", 2, 64, 8, 2, 8, 128, 512, 256, 10000.0f, 1e-5f, true, false)},
      {"tiny-mqa", make_shape("llama", 2, 64, 8, 1, 8, 128, 512, 256, 10000.0f, 1e-5f, true, false)},
      {"tiny-untied", make_shape("llama", 2, 64, 4, 2, 16, 128, 512, 256, 10000.0f, 1e-5f, false, false)},
      {"qwen2-tiny", make_shape("qwen2", 2, 64, 4, 2, 16, 128, 512, 256, 1000000.0f, 1e-6f, true, true)},
      {"qwen3-tiny", make_shape("qwen3", 2, 64, 4, 2, 32, 128, 512, 256, 1000000.0f, 1e-6f, true, false)},
      {"qwen3-0.6b", make_shape("qwen3", 28, 1024, 16, 8, 128, 3072, 151936, 40960, 1000000.0f, 1e-6f, true, false)},
      // Gemma 3: 6 layers so one is global (layer 5); a window of 24 crosses 16-token blocks.
      // Phi-3: q/k/v and gate/up fused; Phi-3-mini's shapes (4k context; its window of 2047).
      {"phi3-tiny", make_shape("phi3", 2, 64, 4, 4, 16, 128, 512, 256, 10000.0f, 1e-5f, false, false)},
      {"phi-3-mini", with_window(make_shape("phi3", 32, 3072, 32, 32, 96, 8192, 32064, 4096, 10000.0f, 1e-5f, false,
                                              false),
                                   2047)},
      {"gemma3-tiny", with_window(make_shape("gemma3", 6, 64, 4, 2, 32, 128, 512, 256, 1000000.0f, 1e-6f, true,
                                               false),
                                    24)},
      {"gemma-3-1b", with_window(make_shape("gemma3", 26, 1152, 4, 1, 256, 6912, 262144, 32768, 1000000.0f, 1e-6f,
                                              true, false),
                                   512)},
  };
  return kPresets;
}

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

// How one tensor's values are drawn.
struct Distribution {
  float center = 0.0f;
  float std = 1.0f;
};

// A uniform distribution on [-a, a] has std a / sqrt(3).
float uniform_amplitude(float std) { return std * std::sqrt(3.0f); }

class TensorGenerator {
 public:
  TensorGenerator(GgufWriter& writer, ThreadPool& pool, uint64_t seed, GgmlType weight_type)
      : writer_(writer), pool_(pool), seed_(seed), weight_type_(weight_type) {}

  // [rows, cols] row-major, GGUF dims {cols, rows}; rows that do not fill whole blocks stay f32.
  void matrix(const std::string& name, int64_t rows, int64_t cols, Distribution d) {
    const GgmlType type = cols % ggml_type_traits(weight_type_).block_size == 0 ? weight_type_ : GgmlType::kF32;
    add(name, type, {cols, rows}, rows, cols, d);
  }
  // Norm weights and biases: always f32, as the loader reads them.
  void vector(const std::string& name, int64_t n, Distribution d) { add(name, GgmlType::kF32, {n}, 1, n, d); }
  // Given values (the rope_freqs factors), as f32.
  void values(const std::string& name, std::vector<float> v) {
    const int64_t n = static_cast<int64_t>(v.size());
    writer_.add_tensor(name, GgmlType::kF32, {n}, [v = std::move(v)](uint8_t* dst, uint64_t num_bytes) {
      std::memcpy(dst, v.data(), num_bytes);
    });
  }

 private:
  void add(const std::string& name, GgmlType type, std::vector<int64_t> dims, int64_t rows, int64_t cols,
           Distribution d) {
    const uint64_t tensor_seed = mix64(seed_) ^ name_hash(name);
    const float amplitude = uniform_amplitude(d.std);
    ThreadPool& pool = pool_;
    writer_.add_tensor(name, type, std::move(dims),
                       [&pool, tensor_seed, type, rows, cols, d, amplitude](uint8_t* dst, uint64_t /*num_bytes*/) {
                         const uint64_t row_bytes = ggml_row_bytes(type, cols);
                         // Chunks of ~64k values amortize the dispatch without starving threads.
                         const int64_t min_rows = std::max<int64_t>(1, (int64_t{1} << 16) / cols);
                         pool.parallel_for(rows, min_rows, [&](int64_t begin, int64_t end) {
                           std::vector<float> row(static_cast<size_t>(cols));  // [cols]
                           for (int64_t r = begin; r < end; ++r) {
                             RowGenerator(tensor_seed, r).fill(row.data(), cols, d.center, amplitude);
                             quantize_row_reference(type, row.data(), dst + static_cast<uint64_t>(r) * row_bytes, cols);
                           }
                         });
                       });
  }

  GgufWriter& writer_;
  ThreadPool& pool_;
  uint64_t seed_;
  GgmlType weight_type_;
};

Status check_range(const char* field, int64_t value, int64_t min, int64_t max) {
  if (value < min || value > max) {
    return Status::errorf("synth shape: {} = {} is out of range [{}, {}]", field, value, min, max);
  }
  return Status::ok_status();
}

}  // namespace

int64_t SynthShape::num_parameters() const {
  const int64_t d = dim;
  const int64_t per_layer = 2 * d                                          // attn_norm, ffn_norm
                            + d * q_dim() + 2 * d * kv_dim() + q_dim() * d  // q, k, v, output
                            + 3 * d * ffn_dim                              // gate, up, down
                            + (qkv_bias ? q_dim() + 2 * kv_dim() : 0)
                            + (architecture == "qwen3" || architecture == "gemma3" ? 2 * head_dim : 0)
                            + (architecture == "gemma3" ? 2 * d : 0);  // post-norms
  const bool freqs_tensor = rope_scaling.type == "llama3";
  return int64_t{vocab_size} * d * (tied_output ? 1 : 2) + d + per_layer * num_layers + (freqs_tensor ? head_dim / 2 : 0);
}

Status SynthShape::validate() const {
  if (architecture != "llama" && architecture != "qwen2" && architecture != "qwen3" && architecture != "gemma3" &&
      architecture != "phi3") {
    return Status::errorf("synth shape: architecture '{}' is not supported (llama, qwen2, qwen3, gemma3, phi3)",
                          architecture);
  }
  if (architecture == "gemma3" && sliding_window <= 0) {
    return Status::errorf("synth shape: gemma3 needs a sliding window (got {})", sliding_window);
  }
  if (architecture != "gemma3" && architecture != "phi3" && (sliding_window != 0 || sliding_window_period != 0)) {
    return Status::errorf("synth shape: a sliding window is a gemma3 or phi3 feature, not {}'s", architecture);
  }
  if (architecture == "phi3" && sliding_window_period != 0) {
    return Status::errorf("synth shape: phi3's window covers every layer; no period");
  }
  if (sliding_window_period < 0 || sliding_window_period > num_layers + 1) {
    return Status::errorf("synth shape: sliding_window_period = {} is out of range [0, {}]", sliding_window_period,
                          num_layers + 1);
  }
  if (!(rope_freq_base_swa > 0.0f) || !std::isfinite(rope_freq_base_swa)) {
    return Status::errorf("synth shape: rope_freq_base_swa = {} must be positive and finite", rope_freq_base_swa);
  }
  const SynthRopeScaling& r = rope_scaling;
  if (r.type != "none" && r.type != "linear" && r.type != "yarn" && r.type != "llama3" && r.type != "llama3-metadata") {
    return Status::errorf("synth shape: rope scaling '{}' is not one of none, linear, yarn, llama3, llama3-metadata",
                          r.type);
  }
  if (r.type != "none" && (!(r.factor >= 1.0f) || !std::isfinite(r.factor))) {
    return Status::errorf("synth shape: rope scaling factor {} must be >= 1", r.factor);
  }
  if ((r.type == "yarn" || r.type.starts_with("llama3")) && r.original_context <= 0) {
    return Status::errorf("synth shape: rope scaling '{}' needs an original context length", r.type);
  }
  if (r.type.starts_with("llama3") && !(r.high_freq_factor > r.low_freq_factor && r.low_freq_factor > 0.0f)) {
    return Status::errorf("synth shape: llama3 rope needs high_freq_factor {} > low_freq_factor {} > 0",
                          r.high_freq_factor, r.low_freq_factor);
  }
  // Bounds match what the model loader accepts and keep byte counts far from overflow.
  KVLM_RETURN_IF_ERROR(check_range("num_layers", num_layers, 1, 1024));
  KVLM_RETURN_IF_ERROR(check_range("dim", dim, 1, 1 << 16));
  KVLM_RETURN_IF_ERROR(check_range("num_heads", num_heads, 1, 1024));
  KVLM_RETURN_IF_ERROR(check_range("num_kv_heads", num_kv_heads, 1, num_heads));
  KVLM_RETURN_IF_ERROR(check_range("head_dim", head_dim, 2, 1024));
  KVLM_RETURN_IF_ERROR(check_range("ffn_dim", ffn_dim, 1, 1 << 20));
  KVLM_RETURN_IF_ERROR(check_range("vocab_size", vocab_size, kSynthMinVocabSize, 1 << 22));
  KVLM_RETURN_IF_ERROR(check_range("context_length", context_length, 1, 1 << 24));
  if (num_heads % num_kv_heads != 0) {
    return Status::errorf("synth shape: num_heads = {} is not a multiple of num_kv_heads = {}", num_heads,
                          num_kv_heads);
  }
  if (head_dim % 2 != 0) return Status::errorf("synth shape: head_dim = {} must be even for RoPE", head_dim);
  if (!(rope_freq_base > 0.0f) || !std::isfinite(rope_freq_base)) {
    return Status::errorf("synth shape: rope_freq_base = {} must be positive and finite", rope_freq_base);
  }
  if (!(rms_eps > 0.0f) || !std::isfinite(rms_eps)) {
    return Status::errorf("synth shape: rms_eps = {} must be positive and finite", rms_eps);
  }
  return Status::ok_status();
}

std::vector<std::string> synth_preset_names() {
  std::vector<std::string> out;
  for (const NamedPreset& p : presets()) out.emplace_back(p.name);
  return out;
}

Result<SynthShape> synth_preset(std::string_view name) {
  for (const NamedPreset& p : presets()) {
    if (name == p.name) return p.shape;
  }
  return Status::errorf("unknown synth preset '{}' (presets: {})", name, fmt::join(synth_preset_names(), ", "));
}

Status synthesize_model(const SynthOptions& options) {
  const SynthShape& s = options.shape;
  KVLM_RETURN_IF_ERROR(s.validate());
  const GgmlType wt = options.weight_type;
  if (!ggml_type_traits(wt).supported) {
    return Status::errorf("synth: weight type {} is not supported", ggml_type_name(wt));
  }
  if (options.out_path.empty()) return Status::error("synth: no output path given");
  if (options.num_threads < 0) return Status::errorf("synth: num_threads = {} must be >= 0", options.num_threads);
  KVLM_ASSIGN_OR_RETURN(SpmVocab vocab, make_synthetic_vocab(s.vocab_size));
  if (s.architecture == "phi3") {
    // Phi-3's chat tokens, which llama.cpp's loader looks up for this architecture: in place of
    // the last pieces, as control tokens.
    const char* kPhi3Tokens[] = {"<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>", "<|user|>"};
    size_t at = vocab.tokens.size() - std::size(kPhi3Tokens);
    for (const char* token : kPhi3Tokens) {
      vocab.tokens[at] = token;
      vocab.scores[at] = 0.0f;
      vocab.token_types[at] = static_cast<int32_t>(TokenType::kControl);
      ++at;
    }
  }

  const std::string& arch = s.architecture;
  GgufWriter w;
  w.set_string(names::kArchitecture, arch);
  w.set_string(names::kName, options.name.empty() ? std::string("synthetic") : options.name);
  w.set_u32(names::kFileType, gguf_file_type(wt));
  w.set_u32(names::key(arch, names::kContextLength), static_cast<uint32_t>(s.context_length));
  w.set_u32(names::key(arch, names::kEmbeddingLength), static_cast<uint32_t>(s.dim));
  w.set_u32(names::key(arch, names::kBlockCount), static_cast<uint32_t>(s.num_layers));
  w.set_u32(names::key(arch, names::kFeedForwardLength), static_cast<uint32_t>(s.ffn_dim));
  w.set_u32(names::key(arch, names::kHeadCount), static_cast<uint32_t>(s.num_heads));
  w.set_u32(names::key(arch, names::kHeadCountKv), static_cast<uint32_t>(s.num_kv_heads));
  // Explicit even when head_dim == dim / num_heads, so readers never have to infer it.
  w.set_u32(names::key(arch, names::kKeyLength), static_cast<uint32_t>(s.head_dim));
  w.set_u32(names::key(arch, names::kValueLength), static_cast<uint32_t>(s.head_dim));
  w.set_u32(names::key(arch, names::kRopeDimensionCount), static_cast<uint32_t>(s.head_dim));
  w.set_f32(names::key(arch, names::kRopeFreqBase), s.rope_freq_base);
  w.set_f32(names::key(arch, names::kRmsEps), s.rms_eps);
  w.set_u32(names::key(arch, names::kVocabSize), static_cast<uint32_t>(s.vocab_size));
  const SynthRopeScaling& rs = s.rope_scaling;
  if (rs.type == "linear" || rs.type == "yarn" || rs.type == "llama3-metadata") {
    w.set_string(names::key(arch, names::kRopeScalingType), rs.type == "llama3-metadata" ? "llama3" : rs.type);
    w.set_f32(names::key(arch, names::kRopeScalingFactor), rs.factor);
  }
  if (rs.type == "yarn" || rs.type == "llama3-metadata") {
    w.set_u32(names::key(arch, names::kRopeScalingOrigContext), static_cast<uint32_t>(rs.original_context));
  }
  if (rs.type == "llama3-metadata") {
    w.set_f32(names::key(arch, names::kRopeLowFreqFactor), rs.low_freq_factor);
    w.set_f32(names::key(arch, names::kRopeHighFreqFactor), rs.high_freq_factor);
  }
  if (arch == "phi3" && s.sliding_window > 0) {
    w.set_u32(names::key(arch, names::kSlidingWindow), static_cast<uint32_t>(s.sliding_window));
  }
  if (arch == "gemma3") {
    w.set_u32(names::key(arch, names::kSlidingWindow), static_cast<uint32_t>(s.sliding_window));
    if (s.sliding_window_period > 0) {
      w.set_u32(names::key(arch, names::kSlidingWindowPattern), static_cast<uint32_t>(s.sliding_window_period));
    }
    w.set_f32(names::key(arch, names::kRopeFreqBaseSwa), s.rope_freq_base_swa);
  }
  add_spm_vocab_metadata(w, vocab);

  ThreadPool pool(options.num_threads > 0 ? options.num_threads : ThreadPool::default_num_threads());
  TensorGenerator gen(w, pool, options.seed, wt);
  const auto fan_in_std = [](int64_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); };
  // Residual branches add 2 * num_layers terms; scaling each by 1/sqrt(2 * num_layers) keeps the stream's rms ~1.
  const auto residual_std = [&](int64_t fan_in) { return fan_in_std(fan_in * 2 * s.num_layers); };
  const Distribution embedding{0.0f, 2.0f * fan_in_std(s.dim)};
  const Distribution norm{1.0f, 0.02f};
  const Distribution bias{0.0f, 0.1f};

  if (rs.type == "llama3") {
    gen.values(names::kRopeFreqs, llama3_frequency_factors(s.head_dim, s.rope_freq_base, rs.factor, rs.low_freq_factor,
                                                           rs.high_freq_factor, rs.original_context));
  }
  gen.matrix(names::kTokenEmbd, s.vocab_size, s.dim, embedding);
  gen.vector(names::kOutputNorm, s.dim, norm);
  if (!s.tied_output) gen.matrix(names::kOutput, s.vocab_size, s.dim, embedding);
  for (int l = 0; l < s.num_layers; ++l) {
    gen.vector(names::blk(l, names::kAttnNorm), s.dim, norm);
    if (arch == "phi3") {  // q, k and v stacked in one tensor, as phi3's converter writes them
      gen.matrix(names::blk(l, names::kAttnQkv), s.q_dim() + 2 * s.kv_dim(), s.dim, {0.0f, fan_in_std(s.dim)});
    } else {
      gen.matrix(names::blk(l, names::kAttnQ), s.q_dim(), s.dim, {0.0f, fan_in_std(s.dim)});
      gen.matrix(names::blk(l, names::kAttnK), s.kv_dim(), s.dim, {0.0f, fan_in_std(s.dim)});
      gen.matrix(names::blk(l, names::kAttnV), s.kv_dim(), s.dim, {0.0f, fan_in_std(s.dim)});
    }
    if (s.qkv_bias) {
      gen.vector(names::blk(l, names::kAttnQBias), s.q_dim(), bias);
      gen.vector(names::blk(l, names::kAttnKBias), s.kv_dim(), bias);
      gen.vector(names::blk(l, names::kAttnVBias), s.kv_dim(), bias);
    }
    if (arch == "qwen3" || arch == "gemma3") {
      gen.vector(names::blk(l, names::kAttnQNorm), s.head_dim, norm);
      gen.vector(names::blk(l, names::kAttnKNorm), s.head_dim, norm);
    }
    gen.matrix(names::blk(l, names::kAttnOutput), s.dim, s.q_dim(), {0.0f, residual_std(s.q_dim())});
    if (arch == "gemma3") gen.vector(names::blk(l, names::kAttnPostNorm), s.dim, norm);
    gen.vector(names::blk(l, names::kFfnNorm), s.dim, norm);
    if (arch == "phi3") {  // gate rows, then up rows, in one tensor
      gen.matrix(names::blk(l, names::kFfnUp), 2 * s.ffn_dim, s.dim, {0.0f, fan_in_std(s.dim)});
    } else {
      gen.matrix(names::blk(l, names::kFfnGate), s.ffn_dim, s.dim, {0.0f, fan_in_std(s.dim)});
      gen.matrix(names::blk(l, names::kFfnUp), s.ffn_dim, s.dim, {0.0f, fan_in_std(s.dim)});
    }
    gen.matrix(names::blk(l, names::kFfnDown), s.dim, s.ffn_dim, {0.0f, residual_std(s.ffn_dim)});
    if (arch == "gemma3") gen.vector(names::blk(l, names::kFfnPostNorm), s.dim, norm);
  }
  return w.write(options.out_path);
}

}  // namespace kvlm
