#include "model/llama2c_converter.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <vector>

#include "core/quantize.h"
#include "gguf/gguf_file_type.h"
#include "gguf/gguf_writer.h"
#include "model/llama_gguf_names.h"

namespace kvlm {
namespace {

namespace names = llama_names;

constexpr uint64_t kHeaderBytes = 7 * sizeof(int32_t);
// "ak42" read as a little-endian int32: the magic of llama2.c's versioned export formats.
constexpr int32_t kLlama2cVersionedMagic = 0x616b3432;
constexpr std::string_view kSpace = "\xE2\x96\x81";  // "▁" U+2581
// A tokenizer file larger than this is not a llama2.c tokenizer (real ones are well under 1 MB).
constexpr uint64_t kMaxTokenizerBytes = uint64_t{1} << 30;
constexpr int32_t kMaxTokenLength = 1 << 16;

// Read-only file for positioned reads; the fillers read tensors straight from it at write time.
class ReadOnlyFile {
 public:
  static Result<ReadOnlyFile> open(const std::string& path) {
    ReadOnlyFile f;
    f.path_ = path;
    f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (f.fd_ < 0) return Status::errorf("{}: cannot open: {}", path, std::strerror(errno));
    struct stat st {};
    if (::fstat(f.fd_, &st) != 0) return Status::errorf("{}: cannot stat: {}", path, std::strerror(errno));
    if (!S_ISREG(st.st_mode)) return Status::errorf("{}: not a regular file", path);
    f.size_ = static_cast<uint64_t>(st.st_size);
    return f;
  }

  ReadOnlyFile(ReadOnlyFile&& o) noexcept : path_(std::move(o.path_)), fd_(o.fd_), size_(o.size_) { o.fd_ = -1; }
  ReadOnlyFile& operator=(ReadOnlyFile&&) = delete;
  ~ReadOnlyFile() {
    if (fd_ >= 0) ::close(fd_);
  }

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }

  // Reads exactly num_bytes at offset; false on an I/O error or a short file.
  bool read_at(uint64_t offset, void* dst, uint64_t num_bytes) const {
    auto* out = static_cast<uint8_t*>(dst);
    while (num_bytes > 0) {
      const ssize_t n = ::pread(fd_, out, num_bytes, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      out += n;
      offset += static_cast<uint64_t>(n);
      num_bytes -= static_cast<uint64_t>(n);
    }
    return true;
  }

 private:
  ReadOnlyFile() = default;
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Float offsets (after the header) of each weight group, in llama2.c's order.
struct Llama2cLayout {
  uint64_t token_embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, freq_cis, wcls, end;

  explicit Llama2cLayout(const Llama2cConfig& c) {
    const uint64_t dim = static_cast<uint64_t>(c.dim);
    const uint64_t hidden = static_cast<uint64_t>(c.hidden_dim);
    const uint64_t layers = static_cast<uint64_t>(c.num_layers);
    const uint64_t q_dim = static_cast<uint64_t>(c.num_heads) * static_cast<uint64_t>(c.head_size());
    const uint64_t kv_dim = static_cast<uint64_t>(c.num_kv_heads) * static_cast<uint64_t>(c.head_size());
    const uint64_t vocab = static_cast<uint64_t>(c.vocab_size);
    uint64_t at = 0;
    auto take = [&at](uint64_t n) {
      const uint64_t start = at;
      at += n;
      return start;
    };
    token_embedding = take(vocab * dim);
    rms_att = take(layers * dim);
    wq = take(layers * q_dim * dim);
    wk = take(layers * kv_dim * dim);
    wv = take(layers * kv_dim * dim);
    wo = take(layers * dim * q_dim);
    rms_ffn = take(layers * dim);
    w1 = take(layers * hidden * dim);
    w2 = take(layers * dim * hidden);
    w3 = take(layers * hidden * dim);
    rms_final = take(dim);
    // freq_cis_real and freq_cis_imag, [seq_len, head_size / 2] each; unused (RoPE is recomputed).
    freq_cis = take(static_cast<uint64_t>(c.seq_len) * static_cast<uint64_t>(c.head_size()));
    wcls = take(c.shared_classifier ? 0 : vocab * dim);
    end = at;
  }
};

// The first read failure inside a TensorFiller, which cannot return a Status itself.
class FillErrors {
 public:
  void record(std::string message) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (first_.empty()) first_ = std::move(message);
  }
  Status status() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return first_.empty() ? Status::ok_status() : Status::error(first_);
  }

 private:
  mutable std::mutex mutex_;
  std::string first_;
};

bool is_writable_weight_type(GgmlType type) { return ggml_type_traits(type).supported; }

// The stored type of a [rows, cols] matrix: the requested one when cols fills whole blocks, else f32.
GgmlType matrix_type(GgmlType wanted, int64_t cols) {
  return cols % ggml_type_traits(wanted).block_size == 0 ? wanted : GgmlType::kF32;
}

// Adds a tensor of rows × cols f32 values read from `file` at float offset `first_float`
// (after the header), converted to `type` one row at a time.
void add_checkpoint_tensor(GgufWriter& writer, const ReadOnlyFile& file, FillErrors& errors, const std::string& name,
                           GgmlType type, std::vector<int64_t> dims, uint64_t first_float) {
  const int64_t cols = dims[0];
  const int64_t rows = dims.size() > 1 ? dims[1] : 1;
  const uint64_t offset = kHeaderBytes + first_float * sizeof(float);
  writer.add_tensor(name, type, std::move(dims),
                    [&file, &errors, name, type, rows, cols, offset](uint8_t* dst, uint64_t num_bytes) {
                      const uint64_t row_bytes = ggml_row_bytes(type, cols);
                      std::vector<float> row(static_cast<size_t>(cols));  // [cols]
                      for (int64_t r = 0; r < rows; ++r) {
                        const uint64_t at = offset + static_cast<uint64_t>(r * cols) * sizeof(float);
                        if (!file.read_at(at, row.data(), static_cast<uint64_t>(cols) * sizeof(float))) {
                          errors.record(fmt::format("{}: read failed at byte {} while copying '{}'", file.path(), at,
                                                    name));
                          std::memset(dst, 0, num_bytes);
                          return;
                        }
                        quantize_row_reference(type, row.data(), dst + static_cast<uint64_t>(r) * row_bytes, cols);
                      }
                    });
}

Status check_field(const std::string& path, const char* field, int64_t value, int64_t max) {
  if (value <= 0 || value > max) {
    return Status::errorf("{}: header field {} = {} is out of range [1, {}]", path, field, value, max);
  }
  return Status::ok_status();
}

}  // namespace

uint64_t Llama2cConfig::expected_file_bytes() const {
  return kHeaderBytes + Llama2cLayout(*this).end * sizeof(float);
}

Result<Llama2cConfig> read_llama2c_config(const std::string& checkpoint_path) {
  KVLM_ASSIGN_OR_RETURN(ReadOnlyFile file, ReadOnlyFile::open(checkpoint_path));
  const std::string& path = checkpoint_path;
  if (file.size() < kHeaderBytes) {
    return Status::errorf("{}: file is {} bytes, shorter than the 28-byte llama2.c header", path, file.size());
  }
  std::array<int32_t, 7> h{};
  if (!file.read_at(0, h.data(), kHeaderBytes)) return Status::errorf("{}: cannot read the header", path);
  if (h[0] == kLlama2cVersionedMagic) {
    return Status::errorf("{}: this is a versioned llama2.c export (magic \"ak42\", version {}); only the legacy "
                          "format (run.c's, no magic) is supported",
                          path, h[1]);
  }
  Llama2cConfig c;
  // Bounds keep the size arithmetic below far from overflow while admitting every real model.
  KVLM_RETURN_IF_ERROR(check_field(path, "dim", h[0], 1 << 16));
  KVLM_RETURN_IF_ERROR(check_field(path, "hidden_dim", h[1], 1 << 20));
  KVLM_RETURN_IF_ERROR(check_field(path, "n_layers", h[2], 1024));
  KVLM_RETURN_IF_ERROR(check_field(path, "n_heads", h[3], 1024));
  KVLM_RETURN_IF_ERROR(check_field(path, "n_kv_heads", h[4], 1024));
  // The sign of vocab_size carries the shared-classifier flag; widen before negating INT32_MIN.
  KVLM_RETURN_IF_ERROR(check_field(path, "vocab_size (absolute value)", std::abs(int64_t{h[5]}), 1 << 22));
  KVLM_RETURN_IF_ERROR(check_field(path, "seq_len", h[6], 1 << 24));
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.num_layers = h[2];
  c.num_heads = h[3];
  c.num_kv_heads = h[4];
  c.vocab_size = std::abs(h[5]);
  c.shared_classifier = h[5] > 0;
  c.seq_len = h[6];
  if (c.dim % c.num_heads != 0) {
    return Status::errorf("{}: header field dim = {} is not a multiple of n_heads = {}", path, c.dim, c.num_heads);
  }
  if (c.num_kv_heads > c.num_heads || c.num_heads % c.num_kv_heads != 0) {
    return Status::errorf("{}: header field n_heads = {} is not a multiple of n_kv_heads = {}", path, c.num_heads,
                          c.num_kv_heads);
  }
  if (c.head_size() % 2 != 0) {
    return Status::errorf("{}: head size dim / n_heads = {} must be even (RoPE rotates pairs)", path, c.head_size());
  }
  const uint64_t expected = c.expected_file_bytes();
  if (file.size() != expected) {
    Llama2cConfig other = c;
    other.shared_classifier = !c.shared_classifier;
    const bool other_fits = file.size() == other.expected_file_bytes();
    return Status::errorf(
        "{}: file is {} bytes but the header (dim {}, hidden_dim {}, n_layers {}, n_heads {}, n_kv_heads {}, "
        "vocab_size {}, seq_len {}, {} classifier) implies {} bytes{}",
        path, file.size(), c.dim, c.hidden_dim, c.num_layers, c.num_heads, c.num_kv_heads, h[5], c.seq_len,
        c.shared_classifier ? "shared" : "separate", expected,
        other_fits ? fmt::format("; the size fits a {} classifier, so the sign of vocab_size is wrong",
                                 other.shared_classifier ? "shared" : "separate")
                   : (file.size() < expected ? " (truncated?)" : " (trailing data?)"));
  }
  return c;
}

Result<SpmVocab> read_llama2c_tokenizer(const std::string& tokenizer_path, int vocab_size) {
  const std::string& path = tokenizer_path;
  if (vocab_size <= 0) return Status::errorf("{}: expected vocab_size {} must be positive", path, vocab_size);
  KVLM_ASSIGN_OR_RETURN(ReadOnlyFile file, ReadOnlyFile::open(path));
  if (file.size() > kMaxTokenizerBytes) {
    return Status::errorf("{}: {} bytes is too large for a llama2.c tokenizer", path, file.size());
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(file.size()));
  if (!file.read_at(0, bytes.data(), bytes.size())) return Status::errorf("{}: cannot read the file", path);

  size_t at = 0;
  auto read_i32 = [&](int32_t& v) {
    if (bytes.size() - at < 4) return false;
    std::memcpy(&v, bytes.data() + at, 4);
    at += 4;
    return true;
  };
  int32_t max_token_length = 0;
  if (!read_i32(max_token_length)) return Status::errorf("{}: file is too short for max_token_length", path);
  if (max_token_length <= 0 || max_token_length > kMaxTokenLength) {
    return Status::errorf("{}: max_token_length = {} is out of range [1, {}]", path, max_token_length,
                          kMaxTokenLength);
  }

  SpmVocab vocab;
  vocab.tokens.reserve(static_cast<size_t>(vocab_size));
  vocab.scores.reserve(static_cast<size_t>(vocab_size));
  vocab.token_types.reserve(static_cast<size_t>(vocab_size));
  for (int id = 0; id < vocab_size; ++id) {
    const size_t entry_at = at;
    float score = 0;
    int32_t length = 0;
    if (bytes.size() - at < 8) {
      return Status::errorf("{}: file ends at token {} (byte {}) but the checkpoint's vocab_size is {}", path, id,
                            entry_at, vocab_size);
    }
    std::memcpy(&score, bytes.data() + at, 4);
    std::memcpy(&length, bytes.data() + at + 4, 4);
    at += 8;
    if (std::isnan(score)) return Status::errorf("{}: token {} (byte {}): score is NaN", path, id, entry_at);
    if (length < 0 || length > max_token_length) {
      return Status::errorf("{}: token {} (byte {}): length {} is out of range [0, max_token_length {}]", path, id,
                            entry_at, length, max_token_length);
    }
    if (bytes.size() - at < static_cast<size_t>(length)) {
      return Status::errorf("{}: token {} (byte {}): its {} bytes run past the end of the file", path, id, entry_at,
                            length);
    }
    std::string text(reinterpret_cast<const char*>(bytes.data() + at), static_cast<size_t>(length));
    at += static_cast<size_t>(length);

    // llama2.c stores <s> and </s> as "\n<s>\n"; GGUF vocabularies name the specials plainly.
    TokenType type = TokenType::kNormal;
    if (id == kSpmUnkId) {
      text = "<unk>";
      type = TokenType::kUnknown;
    } else if (id == kSpmBosId) {
      text = "<s>";
      type = TokenType::kControl;
    } else if (id == kSpmEosId) {
      text = "</s>";
      type = TokenType::kControl;
    } else if (text.empty()) {
      type = TokenType::kControl;
    } else if (is_spm_byte_piece(text)) {
      type = TokenType::kByte;
    } else {
      // llama2.c's export decoded SentencePiece's "▁" to ' '; GGUF keeps the SentencePiece form.
      std::string piece;
      piece.reserve(text.size() + 8);
      for (char ch : text) {
        if (ch == ' ') {
          piece += kSpace;
        } else {
          piece += ch;
        }
      }
      text = std::move(piece);
    }
    vocab.tokens.push_back(std::move(text));
    vocab.scores.push_back(score);
    vocab.token_types.push_back(static_cast<int32_t>(type));
  }
  if (at != bytes.size()) {
    return Status::errorf("{}: {} bytes remain after {} tokens: the tokenizer does not match the checkpoint's "
                          "vocab_size {}",
                          path, bytes.size() - at, vocab_size, vocab_size);
  }
  return vocab;
}

Status convert_llama2c(const Llama2cConvertOptions& options) {
  if (!is_writable_weight_type(options.weight_type)) {
    return Status::errorf("convert: weight type {} is not supported ({})", ggml_type_name(options.weight_type),
                          supported_ggml_type_names());
  }
  if (options.out_path.empty()) return Status::error("convert: no output path given");
  KVLM_ASSIGN_OR_RETURN(const Llama2cConfig c, read_llama2c_config(options.checkpoint_path));
  KVLM_ASSIGN_OR_RETURN(const SpmVocab vocab, read_llama2c_tokenizer(options.tokenizer_path, c.vocab_size));
  KVLM_ASSIGN_OR_RETURN(ReadOnlyFile file, ReadOnlyFile::open(options.checkpoint_path));
  // The file was validated above; a change in between would make every offset wrong.
  if (file.size() != c.expected_file_bytes()) {
    return Status::errorf("{}: file changed size while converting", options.checkpoint_path);
  }

  const std::string arch = "llama";
  const std::string name =
      options.name.empty() ? std::filesystem::path(options.checkpoint_path).stem().string() : options.name;
  GgufWriter w;
  w.set_string(names::kArchitecture, arch);
  w.set_string(names::kName, name);
  w.set_u32(names::kFileType, gguf_file_type(options.weight_type));
  w.set_u32(names::key(arch, names::kContextLength), static_cast<uint32_t>(c.seq_len));
  w.set_u32(names::key(arch, names::kEmbeddingLength), static_cast<uint32_t>(c.dim));
  w.set_u32(names::key(arch, names::kBlockCount), static_cast<uint32_t>(c.num_layers));
  w.set_u32(names::key(arch, names::kFeedForwardLength), static_cast<uint32_t>(c.hidden_dim));
  w.set_u32(names::key(arch, names::kHeadCount), static_cast<uint32_t>(c.num_heads));
  w.set_u32(names::key(arch, names::kHeadCountKv), static_cast<uint32_t>(c.num_kv_heads));
  w.set_u32(names::key(arch, names::kRopeDimensionCount), static_cast<uint32_t>(c.head_size()));
  // llama2.c hard-codes both (run.c: 1e-5f in rmsnorm, 10000.0f in the RoPE frequencies).
  w.set_f32(names::key(arch, names::kRmsEps), 1e-5f);
  w.set_f32(names::key(arch, names::kRopeFreqBase), 10000.0f);
  w.set_u32(names::key(arch, names::kVocabSize), static_cast<uint32_t>(c.vocab_size));
  add_spm_vocab_metadata(w, vocab);

  const Llama2cLayout layout(c);
  FillErrors errors;
  const int64_t dim = c.dim;
  const int64_t hidden = c.hidden_dim;
  const int64_t q_dim = static_cast<int64_t>(c.num_heads) * c.head_size();
  const int64_t kv_dim = static_cast<int64_t>(c.num_kv_heads) * c.head_size();
  const GgmlType wt = options.weight_type;
  // Norms stay f32: they are tiny and the loader reads them as f32 vectors.
  auto add_vector = [&](const std::string& tensor, int64_t n, uint64_t first_float) {
    add_checkpoint_tensor(w, file, errors, tensor, GgmlType::kF32, {n}, first_float);
  };
  auto add_matrix = [&](const std::string& tensor, int64_t rows, int64_t cols, uint64_t first_float) {
    add_checkpoint_tensor(w, file, errors, tensor, matrix_type(wt, cols), {cols, rows}, first_float);
  };
  add_matrix(names::kTokenEmbd, c.vocab_size, dim, layout.token_embedding);
  add_vector(names::kOutputNorm, dim, layout.rms_final);
  if (!c.shared_classifier) add_matrix(names::kOutput, c.vocab_size, dim, layout.wcls);
  for (int l = 0; l < c.num_layers; ++l) {
    const uint64_t li = static_cast<uint64_t>(l);
    const uint64_t d = static_cast<uint64_t>(dim);
    add_vector(names::blk(l, names::kAttnNorm), dim, layout.rms_att + li * d);
    add_matrix(names::blk(l, names::kAttnQ), q_dim, dim, layout.wq + li * static_cast<uint64_t>(q_dim) * d);
    add_matrix(names::blk(l, names::kAttnK), kv_dim, dim, layout.wk + li * static_cast<uint64_t>(kv_dim) * d);
    add_matrix(names::blk(l, names::kAttnV), kv_dim, dim, layout.wv + li * static_cast<uint64_t>(kv_dim) * d);
    add_matrix(names::blk(l, names::kAttnOutput), dim, q_dim, layout.wo + li * d * static_cast<uint64_t>(q_dim));
    add_vector(names::blk(l, names::kFfnNorm), dim, layout.rms_ffn + li * d);
    const uint64_t ffn_block = static_cast<uint64_t>(hidden) * d;
    add_matrix(names::blk(l, names::kFfnGate), hidden, dim, layout.w1 + li * ffn_block);
    add_matrix(names::blk(l, names::kFfnUp), hidden, dim, layout.w3 + li * ffn_block);
    add_matrix(names::blk(l, names::kFfnDown), dim, hidden, layout.w2 + li * ffn_block);
  }

  KVLM_RETURN_IF_ERROR(w.write(options.out_path));
  if (Status s = errors.status(); !s.ok()) {
    std::error_code ignored;
    std::filesystem::remove(options.out_path, ignored);  // never leave a file with zeroed tensors behind
    return s;
  }
  return Status::ok_status();
}

}  // namespace kvlm
