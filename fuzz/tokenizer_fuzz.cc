// Fuzz target tokenizer: arbitrary bytes through both tokenizers (SentencePiece-style and
// byte-level BPE under every pre-tokenizer type), built from small vocabularies made here.
// Input: byte 0 picks the tokenizer, byte 1 the options, the rest is the text; the same bytes,
// read as 16-bit ids (some outside the vocabulary), are decoded and streamed.
//
// Asserted, because the tokenizers promise it (model/tokenizer.h, incremental_detokenizer.h):
//  - every id encode returns is inside the vocabulary;
//  - decode(encode(text)) == text for plain text (SpecialTokens::kAsText) wherever the
//    vocabulary has every byte: BPE always (NFC-normalizing types give the NFC text); SPM for
//    text without U+2581, which SentencePiece itself prints as a space, and only without
//    user-defined tokens (SPM adds its dummy prefix again after each one, as HF does);
//  - the incremental detokenizer's text is sanitize_utf8(decode(ids)), valid UTF-8.
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "fuzz/fuzz_input.h"
#include "fuzz/fuzz_targets.h"
#include "model/bpe_pre_tokenizer.h"
#include "model/bpe_tokenizer.h"
#include "model/incremental_detokenizer.h"
#include "model/synthetic_vocab.h"
#include "model/tokenizer.h"
#include "model/unicode_normalize.h"
#include "model/unicode_utf8.h"

namespace kvlm::fuzz {
namespace {

struct FuzzedTokenizer {
  std::unique_ptr<Tokenizer> tokenizer;
  bool round_trips = false;  // decode(encode(text)) == text is promised (see the top)
  bool spm = false;
  bool nfc = false;
};

// The synthetic SentencePiece vocabulary (bytes, specials, pieces); `extras` appends
// user-defined and control tokens so kParse has something to split out.
FuzzedTokenizer make_spm(bool add_space_prefix, bool extras) {
  SpmVocab spm = make_synthetic_vocab(600).value();
  TokenizerVocab vocab;
  vocab.model = "llama";
  vocab.tokens = spm.tokens;
  vocab.scores = spm.scores;
  vocab.token_types = spm.token_types;
  vocab.unk_id = kSpmUnkId;
  vocab.bos_id = kSpmBosId;
  vocab.eos_id = kSpmEosId;
  vocab.add_space_prefix = add_space_prefix;
  if (extras) {
    for (const char* text : {"<tool>", "\n\n", "<|im_end|>"}) {
      vocab.tokens.push_back(text);
      vocab.scores.push_back(0.0f);
      vocab.token_types.push_back(static_cast<int32_t>(text[1] == '|' ? TokenType::kControl : TokenType::kUserDefined));
    }
  }
  auto tokenizer = Tokenizer::create(std::move(vocab));
  KVLM_CHECK(tokenizer.ok(), "synthetic SPM vocabulary rejected: {}", tokenizer.status().message());
  return {std::move(tokenizer).value(), !extras, true, false};
}

// GPT-2's byte-to-symbol map: printable Latin-1 bytes stand for themselves, the other bytes
// take U+0100 upwards in byte order.
std::string byte_symbol(int byte) {
  int next = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const int code_point = printable ? b : next++;
    if (b == byte) {
      std::string out;
      append_utf8(static_cast<char32_t>(code_point), &out);
      return out;
    }
  }
  return {};
}

// Every byte symbol (ids 0..255), a handful of merges over common text, a user-defined and a
// control token.
FuzzedTokenizer make_bpe(const char* pre) {
  TokenizerVocab vocab;
  vocab.model = "gpt2";
  vocab.pre = pre;
  vocab.add_bos = false;
  for (int b = 0; b < 256; ++b) vocab.tokens.push_back(byte_symbol(b));
  const char* merges[][2] = {{"Ġ", "t"}, {"h", "e"},  {"Ġt", "he"}, {"i", "n"},  {"Ġ", "a"}, {"e", "r"},
                             {"1", "2"}, {"12", "3"}, {"Ġ", "Ġ"},   {"Ċ", "Ċ"},  {"'", "s"}, {"Ã", "©"},
                             {"o", "n"}, {"Ġ", "in"}, {"Ġa", "n"},  {"Ġan", "d"}};
  for (const auto& merge : merges) {
    vocab.merges.push_back(std::string(merge[0]) + " " + merge[1]);
    vocab.tokens.push_back(std::string(merge[0]) + merge[1]);
  }
  vocab.tokens.push_back("<tool>");
  vocab.tokens.push_back("<|eot|>");
  vocab.token_types.assign(vocab.tokens.size(), static_cast<int32_t>(TokenType::kNormal));
  vocab.token_types[vocab.tokens.size() - 2] = static_cast<int32_t>(TokenType::kUserDefined);
  vocab.token_types[vocab.tokens.size() - 1] = static_cast<int32_t>(TokenType::kControl);
  vocab.eos_id = static_cast<int32_t>(vocab.tokens.size() - 1);
  auto tokenizer = Tokenizer::create(std::move(vocab));
  KVLM_CHECK(tokenizer.ok(), "BPE vocabulary ({}) rejected: {}", pre, tokenizer.status().message());
  const auto& bpe = dynamic_cast<const BpeTokenizer&>(*tokenizer.value());
  const bool nfc = bpe.pre_tokenizer().normalization() == TextNormalization::kNfc;
  return {std::move(tokenizer).value(), true, false, nfc};
}

const std::vector<FuzzedTokenizer>& tokenizers() {
  static const std::vector<FuzzedTokenizer> all = [] {
    std::vector<FuzzedTokenizer> v;
    v.push_back(make_spm(true, false));
    v.push_back(make_spm(false, false));
    v.push_back(make_spm(true, true));
    for (const char* pre : {"default", "llama3", "qwen2", "deepseek-v3", "gpt-4o", "tekken", "smollm", "deepseek-llm",
                            "deepseek-coder", "falcon", "dbrx", "mpt", "stablelm2", "command-r", "bloom"}) {
      v.push_back(make_bpe(pre));
    }
    return v;
  }();
  return all;
}

bool contains_spm_space(std::string_view text) { return text.find("\xE2\x96\x81") != std::string_view::npos; }

void check_encode(const FuzzedTokenizer& t, std::string_view text, bool add_bos, SpecialTokens special) {
  const Tokenizer& tok = *t.tokenizer;
  const std::vector<TokenId> ids = tok.encode(text, add_bos, special);
  for (const TokenId id : ids) KVLM_CHECK(id >= 0 && id < tok.vocab_size(), "encode gave id {}", id);
  const std::string decoded = tok.decode(ids);
  if (special != SpecialTokens::kAsText || !t.round_trips) return;
  if (t.spm && contains_spm_space(text)) return;
  const std::string want = t.nfc ? nfc_normalize(text) : std::string(text);
  KVLM_CHECK(decoded == want, "round trip: {} bytes in, {} bytes out", want.size(), decoded.size());
}

// Ids from pairs of bytes, spanning a little past both ends of the vocabulary.
std::vector<TokenId> ids_from(std::string_view bytes, int vocab_size) {
  std::vector<TokenId> ids;
  for (size_t i = 0; i + 1 < bytes.size(); i += 2) {
    const int raw = static_cast<uint8_t>(bytes[i]) << 8 | static_cast<uint8_t>(bytes[i + 1]);
    ids.push_back(static_cast<TokenId>(raw % (vocab_size + 8) - 4));
  }
  return ids;
}

void check_decode(const Tokenizer& tok, const std::vector<TokenId>& ids) {
  const std::string decoded = tok.decode(ids);
  for (const TokenId id : ids) (void)tok.token_to_piece(id);
  // Streaming: a prompt of the first third, pushes for the rest.
  const size_t num_prompt = ids.size() / 3;
  IncrementalDetokenizer stream(tok);
  std::string text = stream.set_prompt(std::span<const TokenId>(ids.data(), num_prompt));
  for (size_t i = num_prompt; i < ids.size(); ++i) text += stream.push(ids[i]);
  text += stream.finish();
  KVLM_CHECK(text == stream.text(), "the detokenizer's returned text differs from text()");
  KVLM_CHECK(is_valid_utf8(text), "the detokenizer emitted invalid UTF-8");
  KVLM_CHECK(text == sanitize_utf8(decoded), "streamed text ({} bytes) is not the sanitized decode ({} bytes)",
             text.size(), sanitize_utf8(decoded).size());
}

}  // namespace

int tokenizer_one_input(const uint8_t* data, size_t size) {
  FuzzInput in(data, size);
  const auto& all = tokenizers();
  const FuzzedTokenizer& t = all[in.take_byte() % all.size()];
  const uint8_t options = in.take_byte();
  const bool add_bos = (options & 1) != 0;
  const SpecialTokens special = (options & 2) != 0 ? SpecialTokens::kParse : SpecialTokens::kAsText;
  const std::string_view text = in.take_rest();
  check_encode(t, text, add_bos, special);
  check_decode(*t.tokenizer, ids_from(text, t.tokenizer->vocab_size()));
  return 0;
}

}  // namespace kvlm::fuzz

KVLM_LIBFUZZER_ENTRY(kvlm::fuzz::tokenizer_one_input)
