#include "model/tokenizer.h"

#include <limits>

#include "model/bpe_tokenizer.h"
#include "model/spm_tokenizer.h"

namespace kvlm {
namespace {

constexpr std::string_view kModelSpm = "llama";
constexpr std::string_view kModelBpe = "gpt2";

bool is_hex_digit(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// "<0xAB>": SentencePiece's byte-fallback piece.
bool looks_like_byte_piece(std::string_view piece) {
  return piece.size() == 6 && piece.substr(0, 3) == "<0x" && is_hex_digit(piece[3]) && is_hex_digit(piece[4]) &&
         piece[5] == '>';
}

Status check_id(const char* what, int32_t id, size_t num_tokens) {
  if (id == -1 || (id >= 0 && static_cast<size_t>(id) < num_tokens)) return Status::ok_status();
  return Status::errorf("{} {} is outside the vocabulary of {} tokens", what, id, num_tokens);
}

Status validate(const TokenizerVocab& vocab) {
  const size_t n = vocab.tokens.size();
  if (n == 0) return Status::error("the vocabulary has no tokens");
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return Status::errorf("the vocabulary has {} tokens, more than token ids can address", n);
  }
  if (!vocab.scores.empty() && vocab.scores.size() != n) {
    return Status::errorf("{} scores for {} tokens", vocab.scores.size(), n);
  }
  if (!vocab.token_types.empty() && vocab.token_types.size() != n) {
    return Status::errorf("{} token types for {} tokens", vocab.token_types.size(), n);
  }
  for (size_t i = 0; i < vocab.token_types.size(); ++i) {
    const int32_t type = vocab.token_types[i];
    if (type < static_cast<int32_t>(TokenType::kUndefined) || type > static_cast<int32_t>(TokenType::kByte)) {
      return Status::errorf("token {} ('{}') has token type {}, expected 0..6", i, vocab.tokens[i], type);
    }
  }
  KVLM_RETURN_IF_ERROR(check_id("bos_id", vocab.bos_id, n));
  KVLM_RETURN_IF_ERROR(check_id("eos_id", vocab.eos_id, n));
  KVLM_RETURN_IF_ERROR(check_id("unk_id", vocab.unk_id, n));
  KVLM_RETURN_IF_ERROR(check_id("pad_id", vocab.pad_id, n));
  return Status::ok_status();
}

// GGUF files from older converters have no token types; derive what the tokenizer needs.
std::vector<int32_t> infer_token_types(const TokenizerVocab& vocab) {
  std::vector<int32_t> types(vocab.tokens.size(), static_cast<int32_t>(TokenType::kNormal));
  if (vocab.model == kModelSpm) {
    for (size_t i = 0; i < vocab.tokens.size(); ++i) {
      if (looks_like_byte_piece(vocab.tokens[i])) types[i] = static_cast<int32_t>(TokenType::kByte);
    }
  }
  if (vocab.unk_id >= 0) types[vocab.unk_id] = static_cast<int32_t>(TokenType::kUnknown);
  if (vocab.bos_id >= 0) types[vocab.bos_id] = static_cast<int32_t>(TokenType::kControl);
  if (vocab.eos_id >= 0) types[vocab.eos_id] = static_cast<int32_t>(TokenType::kControl);
  return types;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::create(TokenizerVocab vocab) {
  if (vocab.model != kModelSpm && vocab.model != kModelBpe) {
    return Status::errorf("unsupported tokenizer model '{}' (kvlm supports '{}' and '{}')", vocab.model, kModelSpm,
                          kModelBpe);
  }
  if (Status status = validate(vocab); !status.ok()) {
    return status.with_context(fmt::format("tokenizer model '{}'", vocab.model));
  }
  if (vocab.token_types.empty()) vocab.token_types = infer_token_types(vocab);
  if (vocab.model == kModelSpm) return SpmTokenizer::create(std::move(vocab));
  return BpeTokenizer::create(std::move(vocab));
}

Tokenizer::Tokenizer(TokenizerVocab vocab) : vocab_(std::move(vocab)) {
  token_ids_.reserve(vocab_.tokens.size());
  for (size_t i = 0; i < vocab_.tokens.size(); ++i) {
    token_ids_.insert_or_assign(std::string_view(vocab_.tokens[i]), static_cast<TokenId>(i));
    const auto type = static_cast<TokenType>(vocab_.token_types[i]);
    if (type == TokenType::kControl || type == TokenType::kUserDefined || type == TokenType::kUnknown) {
      special_matcher_.add(vocab_.tokens[i], static_cast<TokenId>(i));
    }
    if (type == TokenType::kUserDefined) user_matcher_.add(vocab_.tokens[i], static_cast<TokenId>(i));
  }
}

Tokenizer::~Tokenizer() = default;

TokenType Tokenizer::token_type(TokenId id) const {
  if (id < 0 || id >= vocab_size()) return TokenType::kUndefined;
  return static_cast<TokenType>(vocab_.token_types[id]);
}

std::optional<TokenId> Tokenizer::find_token(std::string_view text) const {
  const auto it = token_ids_.find(text);
  if (it == token_ids_.end()) return std::nullopt;
  return it->second;
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_bos, SpecialTokens special) const {
  std::vector<TokenId> ids;
  if (add_bos && vocab_.bos_id >= 0) ids.push_back(vocab_.bos_id);
  const SpecialTokenMatcher& matcher = special == SpecialTokens::kParse ? special_matcher_ : user_matcher_;
  if (matcher.empty()) {
    if (!text.empty()) encode_text(text, /*after_special=*/true, &ids);
    return ids;
  }
  bool after_special = true;
  size_t pos = 0;
  while (pos < text.size()) {
    const SpecialTokenMatcher::Match match = matcher.find_next(text, pos);
    if (match.begin > pos) {
      encode_text(text.substr(pos, match.begin - pos), after_special, &ids);
      after_special = false;
    }
    if (match.length == 0) break;
    ids.push_back(match.id);
    after_special = true;
    pos = match.begin + match.length;
  }
  return ids;
}

std::string Tokenizer::decode(const std::vector<TokenId>& ids) const {
  std::string text;
  bool strip_next_space = strips_first_space();
  for (const TokenId id : ids) {
    std::string piece = token_to_piece(id);
    if (strip_next_space && token_type(id) != TokenType::kControl) {
      if (!piece.empty() && piece[0] == ' ') piece.erase(0, 1);
      strip_next_space = false;
    }
    text += piece;
  }
  return text;
}

}  // namespace kvlm
