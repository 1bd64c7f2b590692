#include "model/model_quantizer.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/quantize.h"
#include "core/thread_pool.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/llama_gguf_names.h"

namespace kvlm {
namespace {

namespace names = llama_names;

// llama_ftype numbers, as llama-quantize lists them.
const std::array<QuantMix, 17> kMixes = {{
    {"q4_0", GgmlType::kQ4_0, 2},     {"q4_1", GgmlType::kQ4_1, 3},     {"q5_0", GgmlType::kQ5_0, 8},
    {"q5_1", GgmlType::kQ5_1, 9},     {"q8_0", GgmlType::kQ8_0, 7},     {"q2_k", GgmlType::kQ2_K, 10},
    {"q3_k_s", GgmlType::kQ3_K, 11},  {"q3_k_m", GgmlType::kQ3_K, 12},  {"q3_k_l", GgmlType::kQ3_K, 13},
    {"q4_k_s", GgmlType::kQ4_K, 14},  {"q4_k_m", GgmlType::kQ4_K, 15},  {"q5_k_s", GgmlType::kQ5_K, 16},
    {"q5_k_m", GgmlType::kQ5_K, 17},  {"q6_k", GgmlType::kQ6_K, 18},    {"iq4_nl", GgmlType::kIQ4_NL, 25},
    {"iq4_xs", GgmlType::kIQ4_XS, 30}, {"f16", GgmlType::kF16, 1},
}};

// Layers that get more bits in the _M mixes: the first and last eighth, and every third between.
bool use_more_bits(int layer, int num_layers) {
  return layer < num_layers / 8 || layer >= 7 * num_layers / 8 || (layer - num_layers / 8) % 3 == 2;
}

// Rows that are not whole 256-value super-blocks take a 32-block type of similar size.
GgmlType fit_rows(GgmlType type, int64_t cols) {
  const uint32_t block = ggml_type_traits(type).block_size;
  if (cols % block == 0) return type;
  GgmlType fallback = GgmlType::kF16;
  switch (type) {
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
      fallback = GgmlType::kQ4_0;
      break;
    case GgmlType::kIQ4_XS:
      fallback = GgmlType::kIQ4_NL;
      break;
    case GgmlType::kQ4_K:
      fallback = GgmlType::kQ5_0;
      break;
    case GgmlType::kQ5_K:
      fallback = GgmlType::kQ5_1;
      break;
    case GgmlType::kQ6_K:
      fallback = GgmlType::kQ8_0;
      break;
    default:
      break;
  }
  return cols % ggml_type_traits(fallback).block_size == 0 ? fallback : GgmlType::kF32;
}

// 2-D matrices and 3-D stacks of them (MoE experts, MLA's per-head attn_k_b / attn_v_b). A MoE
// router (ffn_gate_inp) stays as it is: its top-k choices are what small errors would flip.
bool is_weight_matrix(const GgufTensorInfo& t) {
  return (t.dims.size() == 2 || t.dims.size() == 3) && t.name.ends_with(".weight") &&
         !t.name.ends_with("ffn_gate_inp.weight");
}

}  // namespace

Result<QuantMix> parse_quant_mix(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "q3_k") lower = "q3_k_m";  // llama-quantize's aliases
  if (lower == "q4_k") lower = "q4_k_m";
  if (lower == "q5_k") lower = "q5_k_m";
  for (const QuantMix& m : kMixes) {
    if (m.name == lower) return m;
  }
  return Status::errorf("unknown quantization type '{}' (types: {})", name, fmt::join(quant_mix_names(), ", "));
}

std::vector<std::string> quant_mix_names() {
  std::vector<std::string> out;
  for (const QuantMix& m : kMixes) out.push_back(m.name);
  return out;
}

GgmlType quant_type_for(const QuantMix& mix, const TensorRole& t) {
  const std::string& m = mix.name;
  const int i = t.layer, n = t.num_layers;
  GgmlType type = mix.base;
  if (t.role == "output.weight") {
    type = m == "q8_0" || m == "f16" ? mix.base : GgmlType::kQ6_K;
  } else if (t.role == "attn_v.weight") {
    if (m == "q2_k") type = t.num_gqa >= 4 ? GgmlType::kQ4_K : GgmlType::kQ3_K;
    if (m == "q3_k_m") type = i < 2 ? GgmlType::kQ5_K : GgmlType::kQ4_K;
    if (m == "q3_k_l") type = GgmlType::kQ5_K;
    if ((m == "q4_k_m" || m == "q5_k_m") && use_more_bits(i, n)) type = GgmlType::kQ6_K;
    if (m == "q4_k_s" && i < 4) type = GgmlType::kQ5_K;
    if ((m == "iq4_xs" || m == "iq4_nl") && t.num_gqa >= 4) type = GgmlType::kQ5_K;
  } else if (t.role == "ffn_down.weight" || t.role == "ffn_down_exps.weight" || t.role == "ffn_down_shexp.weight") {
    if (m == "q2_k") type = GgmlType::kQ3_K;
    if (m == "q3_k_m") type = i < n / 16 ? GgmlType::kQ5_K : GgmlType::kQ4_K;
    if (m == "q3_k_l") type = GgmlType::kQ5_K;
    if ((m == "q4_k_m" || m == "q5_k_m") && use_more_bits(i, n)) type = GgmlType::kQ6_K;
    if ((m == "q4_k_s" || m == "iq4_xs" || m == "iq4_nl") && i < n / 8) type = GgmlType::kQ5_K;
  } else if (t.role == "attn_output.weight") {
    if (m == "q2_k") type = GgmlType::kQ3_K;
    if (m == "q3_k_m") type = GgmlType::kQ4_K;
    if (m == "q3_k_l") type = GgmlType::kQ5_K;
  }
  return fit_rows(type, t.cols);
}

Status quantize_model(const QuantizeOptions& o) {
  KVLM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::open(o.in_path));
  if (o.out_path.empty()) return Status::error("quantize: no output path given");
  KVLM_ASSIGN_OR_RETURN(std::string arch, file->get_string(names::kArchitecture));
  KVLM_ASSIGN_OR_RETURN(int64_t num_layers, file->get_int(names::key(arch, names::kBlockCount)));
  int num_gqa = 1;
  if (auto heads = file->get_int(names::key(arch, names::kHeadCount)); heads.ok()) {
    if (auto kv = file->get_int(names::key(arch, names::kHeadCountKv)); kv.ok() && *kv > 0) {
      num_gqa = static_cast<int>(*heads / *kv);
    }
  }
  for (const GgufTensorInfo& t : file->tensors()) {
    if (is_weight_matrix(t) && t.type != GgmlType::kF32 && t.type != GgmlType::kF16 && t.type != GgmlType::kBF16) {
      return Status::errorf("{}: tensor '{}' is already {}: quantize from an F32, F16 or BF16 file", file->name(),
                            t.name, ggml_type_name(t.type));
    }
  }

  GgufWriter w;
  for (const GgufKeyValue& kv : file->metadata()) w.set(kv.key, kv.value);
  w.set_u32(names::kFileType, o.mix.file_type);
  ThreadPool pool(o.num_threads > 0 ? o.num_threads : ThreadPool::default_num_threads());
  const size_t total = file->tensors().size();
  size_t done = 0;
  // Tensors are converted while the file is written, one after another: progress follows them.
  auto report = [&o, &done, total](const std::string& name, GgmlType type) {
    if (o.progress) o.progress(++done, total, name, type);
  };
  for (const GgufTensorInfo& t : file->tensors()) {
    if (!is_weight_matrix(t)) {
      const GgufTensorInfo* src = &t;
      w.add_tensor(t.name, t.type, t.dims, [src, &report](uint8_t* dst, uint64_t num_bytes) {
        std::copy(src->data, src->data + num_bytes, dst);
        report(src->name, src->type);
      });
      continue;
    }
    TensorRole role;
    // A tied embedding is also the classifier: it gets the output's type.
    role.role = t.name == names::kTokenEmbd && file->find_tensor(names::kOutput) == nullptr ? names::kOutput : t.name;
    role.num_layers = static_cast<int>(num_layers);
    role.cols = t.dims[0];
    role.num_gqa = num_gqa;
    if (t.name.starts_with("blk.")) {
      const size_t dot = t.name.find('.', 4);
      int layer = -1;
      std::from_chars(t.name.data() + 4, t.name.data() + dot, layer);
      role.layer = layer;
      role.role = t.name.substr(dot + 1);
    }
    const GgmlType type = quant_type_for(o.mix, role);
    const int64_t cols = t.dims[0];
    int64_t rows = t.dims[1];
    if (t.dims.size() == 3) rows *= t.dims[2];
    const uint64_t in_row = ggml_row_bytes(t.type, cols), out_row = ggml_row_bytes(type, cols);
    const GgufTensorInfo* src = &t;
    ThreadPool* p = &pool;
    w.add_tensor(t.name, type, t.dims, [src, p, type, rows, cols, in_row, out_row, &report](uint8_t* dst, uint64_t) {
      p->parallel_for(rows, std::max<int64_t>(1, 4096 / cols), [&](int64_t begin, int64_t end) {
        std::vector<float> row(static_cast<size_t>(cols));  // [cols]
        for (int64_t r = begin; r < end; ++r) {
          dequantize_row_reference(src->type, src->data + static_cast<uint64_t>(r) * in_row, row.data(), cols);
          quantize_row_reference(type, row.data(), dst + static_cast<uint64_t>(r) * out_row, cols);
        }
      });
      report(src->name, type);
    });
  }
  return w.write(o.out_path);
}

}  // namespace kvlm
