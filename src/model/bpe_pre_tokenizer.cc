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

// DeepSeek LLM and DeepSeek Coder: no word regex at all (ByteLevel has use_regex false);
// each Split isolates one class of run, then Digits(individual_digits) splits every digit.
// Both start by isolating every "\r" and "\n" on its own.
constexpr const char* kEachNewline = R"re([\r\n])re";
// DeepSeek LLM's letters are an explicit list of cased-letter ranges (Latin, Greek,
// Cyrillic, Armenian, Georgian capitals, Cherokee, fullwidth Latin, ...), not \p{L}: Arabic,
// Hebrew, Thai and Han are no letters here. Written by code point; the tokenizer.json
// spells them as characters, some of which (U+1F7D, U+1FBE, U+2126, U+212A, ...) NFC would
// rewrite if the source were ever normalized.
constexpr const char* kDeepSeekLlmLetters =
    R"re(\s?[A-Za-z\x{b5}\x{c0}-\x{d6}\x{d8}-\x{f6}\x{f8}-\x{1ba}\x{1bc}-\x{1bf}\x{1c4}-\x{293}\x{295}-\x{2af})re"
    R"re(\x{370}-\x{373}\x{376}\x{377}\x{37b}-\x{37d}\x{37f}\x{386}\x{388}-\x{38a}\x{38c}\x{38e}-\x{3a1})re"
    R"re(\x{3a3}-\x{3f5}\x{3f7}-\x{481}\x{48a}-\x{52f}\x{531}-\x{556}\x{10a0}-\x{10c5}\x{13a0}-\x{13f5})re"
    R"re(\x{13f8}-\x{13fd}\x{1c90}-\x{1cba}\x{1cbd}-\x{1cbf}\x{1d00}-\x{1d2b}\x{1d6b}-\x{1d77}\x{1d79}-\x{1d9a})re"
    R"re(\x{1e00}-\x{1f15}\x{1f18}-\x{1f1d}\x{1f20}-\x{1f45}\x{1f48}-\x{1f4d}\x{1f50}-\x{1f57}\x{1f59}\x{1f5b})re"
    R"re(\x{1f5d}\x{1f5f}-\x{1f7d}\x{1f80}-\x{1fb4}\x{1fb6}-\x{1fbc}\x{1fbe}\x{1fc2}-\x{1fc4}\x{1fc6}-\x{1fcc})re"
    R"re(\x{1fd0}-\x{1fd3}\x{1fd6}-\x{1fdb}\x{1fe0}-\x{1fec}\x{1ff2}-\x{1ff4}\x{1ff6}-\x{1ffc}\x{2102}\x{2107})re"
    R"re(\x{210a}-\x{2113}\x{2115}\x{2119}-\x{211d}\x{2124}\x{2126}\x{2128}\x{212a}-\x{212d}\x{212f}-\x{2134})re"
    R"re(\x{2139}\x{213c}-\x{213f}\x{2145}-\x{2149}\x{214e}\x{2183}\x{2184}\x{2c00}-\x{2c7b}\x{2c7e}-\x{2ce4})re"
    R"re(\x{2ceb}-\x{2cee}\x{2cf2}\x{2cf3}\x{a640}-\x{a66d}\x{a680}-\x{a69b}\x{a722}-\x{a76f}\x{a771}-\x{a787})re"
    R"re(\x{a78b}-\x{a78e}\x{ab70}-\x{abbf}\x{fb00}-\x{fb06}\x{fb13}-\x{fb17}\x{ff21}-\x{ff3a}\x{ff41}-\x{ff5a})re"
    R"re(\x{10400}-\x{1044f}\x{104b0}-\x{104d3}\x{104d8}-\x{104fb}\x{10c80}-\x{10cb2}\x{10cc0}-\x{10cf2})re"
    R"re(\x{118a0}-\x{118df}\x{1e900}-\x{1e943}]+)re";
// ASCII punctuation and symbols (":-~" also spans the ASCII letters, which the letter
// stage has already taken), their fullwidth forms, curly quotes U+2018..U+201F and
// U+3000..U+3002 (ideographic space, comma, full stop).
constexpr const char* kDeepSeekLlmPunctuation =
    R"re(\s?[!-/:-~\x{ff01}-\x{ff0f}\x{ff1a}-\x{ff5e}\x{2018}-\x{201f}\x{3000}-\x{3002}]+)re";
constexpr const char* kTrailingSpaces = R"re(\s+$)re";
// U+4E00..U+9FA5 (CJK ideographs), U+0800..U+4E00 (every script from Samaritan through
// Devanagari, Thai, kana and CJK symbols) and U+AC00..U+D7FF (Hangul).
constexpr const char* kDeepSeekLlmCjk = R"re([\x{4e00}-\x{9fa5}\x{800}-\x{4e00}\x{ac00}-\x{d7ff}]+)re";
constexpr const char* kDeepSeekCoderLetters = R"re(\s?\p{L}+)re";
constexpr const char* kDeepSeekCoderPunctuation = R"re(\s?\p{P}+)re";

// Falcon: Punctuation(Contiguous) (Unicode punctuation plus the ASCII symbols Rust's
// is_ascii_punctuation adds), then ByteLevel's GPT-2 regex, then Digits (contiguous) and a
// Split of "[0-9][0-9][0-9]". The last two run on the byte-level *mapped* text, where a
// byte is a numeric character if it is an ASCII digit or one of the Latin-1 bytes that map
// to themselves as numbers: B2 "²", B3 "³", B9 "¹", BC..BE "¼½¾". Those are also UTF-8
// continuation bytes, so Falcon's own tokenizer cuts "м" (D0 BC) into D0 | BC; the byte
// stage reproduces that.
constexpr const char* kFalconPunctuation = R"re([\p{P}$+<=>^`|~]+)re";
constexpr const char* kFalconNumericBytes = R"re([0-9\xB2\xB3\xB9\xBC-\xBE]+)re";
constexpr const char* kDigitTriples = R"re([0-9][0-9][0-9])re";

// BLOOM: one Split, an optional space then anything but whitespace and the sentence
// punctuation listed (tokenizer.json nests "[.,!?…。，、।۔،]" in the class, which
// Oniguruma reads as a union; "(", "|" and ")" are members too, not grouping).
constexpr const char* kBloom =
    R"re( ?[^\s(|).,!?\x{2026}\x{3002}\x{ff0c}\x{3001}\x{964}\x{6d4}\x{60c}]+)re";

#undef KVLM_CONTRACTIONS

// One Split stage: its pattern, over code points unless it says bytes.
struct Stage {
  constexpr Stage(const char* pattern_in, RegexUnit unit_in = RegexUnit::kCodePoint)  // NOLINT: implicit
      : pattern(pattern_in), unit(unit_in) {}
  const char* pattern;
  RegexUnit unit;
};

struct PreTokenizerType {
  const char* type;
  std::initializer_list<std::string_view> gguf_names;
  std::initializer_list<Stage> stages;
  TextNormalization normalization;
  bool ignore_merges;
};

// Qwen2's tokenizer.json normalizes to NFC (Qwen2.5 and Qwen3 alike); the DeepSeek-R1
// distills and Megrez reuse Qwen2's tokenizer. GPT-NeoX-20B's (which MPT uses) and
// Command-R's normalize to NFC too. No other listed tokenizer.json has a normalizer that
// changes text (DeepSeek-V3's is an empty Sequence).
//
// "cl100k" is tiktoken's cl100k_base pattern, the one Llama 3 took: DBRX uses cl100k_base
// itself and GLM-4 (chatglm-bpe) its pattern. (Smaug, smaug-bpe, is a Llama 3 fine-tune with
// Llama 3's tokenizer.json, ignore_merges included: it is a llama3 alias above.) Neither sets
// ignore_merges, as gpt-4o and tekken do not either (and as llama.cpp reads these names);
// tiktoken's own encoder would emit a word that is a token whole, which differs only for
// words the merges cannot reach.
const PreTokenizerType kTypes[] = {
    {"gpt2", {"default", "gpt2", "gpt-2", "phi-2", "olmo"}, {kGpt2}, TextNormalization::kNone, false},
    {"llama3", {"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "smaug-bpe"}, {kLlama3},
     TextNormalization::kNone, true},
    {"qwen2", {"qwen2", "deepseek-r1-qwen", "megrez"}, {kQwen2}, TextNormalization::kNfc, false},
    {"deepseek-v3",
     {"deepseek-v3"},
     {kDeepSeekV3Digits, kDeepSeekV3Cjk, kDeepSeekV3Words},
     TextNormalization::kNone,
     false},
    {"gpt-4o", {"gpt-4o"}, {kGpt4o}, TextNormalization::kNone, false},
    {"tekken", {"tekken"}, {kTekken}, TextNormalization::kNone, false},
    {"smollm", {"smollm", "starcoder"}, {kSingleDigits, kGpt2}, TextNormalization::kNone, false},
    {"deepseek-llm",
     {"deepseek-llm"},
     {kEachNewline, kDeepSeekLlmLetters, kDeepSeekLlmPunctuation, kTrailingSpaces, kDeepSeekLlmCjk, kSingleDigits},
     TextNormalization::kNone,
     false},
    {"deepseek-coder",
     {"deepseek-coder"},
     {kEachNewline, kDeepSeekCoderLetters, kDeepSeekCoderPunctuation, kDeepSeekLlmCjk, kSingleDigits},
     TextNormalization::kNone,
     false},
    {"falcon",
     {"falcon"},
     {kFalconPunctuation, kGpt2, Stage(kFalconNumericBytes, RegexUnit::kByte), kDigitTriples},
     TextNormalization::kNone,
     false},
    {"cl100k", {"dbrx", "chatglm-bpe"}, {kLlama3}, TextNormalization::kNone, false},
    {"gpt-neox", {"mpt"}, {kGpt2}, TextNormalization::kNfc, false},
    {"stablelm2", {"stablelm2"}, {kQwen2}, TextNormalization::kNone, false},
    {"command-r", {"command-r"}, {kSingleDigits, kGpt2}, TextNormalization::kNfc, false},
    {"bloom", {"bloom"}, {kBloom}, TextNormalization::kNone, false},
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
  for (const Stage& stage : type->stages) {
    KVLM_ASSIGN_OR_RETURN(UnicodeRegex regex, UnicodeRegex::compile(stage.pattern, stage.unit));
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
