#include "model/bpe_pre_tokenizer.h"

#include <algorithm>
#include <initializer_list>

#include <fmt/format.h>

namespace kvlm {
namespace {

// Patterns as the models' tokenizer.json files spell them, except that "(?i:'s|'t|...)"
// is written with explicit classes: PCRE2's caseless matching folds "ſ" (U+017F) to "s",
// and the reference encoders do not treat "'ſ" as a contraction.
#define KVLM_CONTRACTIONS "'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]"

constexpr const char* kGpt2 = R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)re";
constexpr const char* kLlama3 = "(?:" KVLM_CONTRACTIONS R"re()|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr const char* kQwen2 = "(?:" KVLM_CONTRACTIONS R"re()|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
// DeepSeek-V3: digits and CJK ideograph/kana runs are isolated first, then the words.
constexpr const char* kDeepSeekV3Digits = R"re(\p{N}{1,3})re";
constexpr const char* kDeepSeekV3Cjk = R"re([\x{4e00}-\x{9fa5}\x{3040}-\x{309f}\x{30a0}-\x{30ff}]+)re";
constexpr const char* kDeepSeekV3Words =
    R"re([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
// tiktoken's o200k (GPT-4o): a word is upper-case letters then lower-case ones (or the
// reverse), with an optional contraction; "/" may end a punctuation run.
constexpr const char* kGpt4o =
    R"re([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:)re" KVLM_CONTRACTIONS
    R"re()?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:)re" KVLM_CONTRACTIONS
    R"re()?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
// Mistral's Tekken: o200k's words without contractions, single digits.
constexpr const char* kTekken =
    R"re([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
// SmolLM / StarCoder: Digits(individual_digits) before ByteLevel's GPT-2 regex.
constexpr const char* kSingleDigits = R"re(\p{N})re";

#undef KVLM_CONTRACTIONS

struct PreTokenizerType {
  const char* type;
  std::initializer_list<std::string_view> gguf_names;
  std::initializer_list<const char*> stages;
  TextNormalization normalization;
  bool ignore_merges;
};

// Qwen2's tokenizer.json normalizes to NFC (Qwen2.5 and Qwen3 alike); the DeepSeek-R1
// distills and Megrez reuse Qwen2's tokenizer. No other listed tokenizer.json has a
// normalizer that changes text (DeepSeek-V3's is an empty Sequence).
const PreTokenizerType kTypes[] = {
    {"gpt2", {"default", "gpt2", "gpt-2", "phi-2", "olmo"}, {kGpt2}, TextNormalization::kNone, false},
    {"llama3", {"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"}, {kLlama3}, TextNormalization::kNone, true},
    {"qwen2", {"qwen2", "deepseek-r1-qwen", "megrez"}, {kQwen2}, TextNormalization::kNfc, false},
    {"deepseek-v3",
     {"deepseek-v3"},
     {kDeepSeekV3Digits, kDeepSeekV3Cjk, kDeepSeekV3Words},
     TextNormalization::kNone,
     false},
    {"gpt-4o", {"gpt-4o"}, {kGpt4o}, TextNormalization::kNone, false},
    {"tekken", {"tekken"}, {kTekken}, TextNormalization::kNone, false},
    {"smollm", {"smollm", "starcoder"}, {kSingleDigits, kGpt2}, TextNormalization::kNone, false},
};

const PreTokenizerType* find_type(std::string_view gguf_pre) {
  for (const PreTokenizerType& type : kTypes) {
    if (std::find(type.gguf_names.begin(), type.gguf_names.end(), gguf_pre) != type.gguf_names.end()) return &type;
  }
  return nullptr;
}

}  // namespace

std::string BpePreTokenizer::known_names() {
  std::string names;
  for (const PreTokenizerType& type : kTypes) {
    for (const std::string_view name : type.gguf_names) {
      if (!names.empty()) names += ", ";
      names += name;
    }
  }
  return names;
}

Result<BpePreTokenizer> BpePreTokenizer::create(std::string_view gguf_pre, std::string* warning) {
  const PreTokenizerType* type = find_type(gguf_pre.empty() ? std::string_view("default") : gguf_pre);
  if (type == nullptr) {
    return Status::errorf(
        "unknown pre-tokenizer type tokenizer.ggml.pre = '{}': kvlm cannot split text as this model was trained "
        "(known types: {})",
        gguf_pre, known_names());
  }
  if (gguf_pre.empty() && warning != nullptr) {
    *warning =
        "the file names no pre-tokenizer (tokenizer.ggml.pre is absent): using GPT-2's, as the format defines; "
        "a newer conversion of the model may tokenize differently";
  }
  BpePreTokenizer pre;
  pre.type_ = type->type;
  pre.normalization_ = type->normalization;
  pre.ignore_merges_ = type->ignore_merges;
  for (const char* pattern : type->stages) {
    KVLM_ASSIGN_OR_RETURN(UnicodeRegex regex, UnicodeRegex::compile(pattern));
    pre.stages_.push_back(std::move(regex));
  }
  return pre;
}

BpePreTokenizer::BpePreTokenizer(BpePreTokenizer&&) noexcept = default;
BpePreTokenizer& BpePreTokenizer::operator=(BpePreTokenizer&&) noexcept = default;
BpePreTokenizer::~BpePreTokenizer() = default;

void BpePreTokenizer::split(std::string_view text, std::vector<std::string_view>* words) const {
  if (stages_.size() == 1) {
    stages_[0].split(text, words);
    return;
  }
  // Each stage splits every word of the one before; views stay into `text` throughout.
  std::vector<std::string_view> current{text};
  std::vector<std::string_view> next;
  for (const UnicodeRegex& stage : stages_) {
    next.clear();
    for (const std::string_view word : current) stage.split(word, &next);
    current.swap(next);
  }
  words->insert(words->end(), current.begin(), current.end());
}

}  // namespace kvlm
