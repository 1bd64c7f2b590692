#include "model/incremental_detokenizer.h"

#include "core/check.h"

namespace kvlm {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

void Utf8StreamRepair::reset_sequence() {
  num_held_ = 0;
  num_needed_ = 0;
  lower_ = 0x80;
  upper_ = 0xBF;
}

void Utf8StreamRepair::append(std::string_view bytes, std::string* out) {
  out->reserve(out->size() + num_held_ + bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    const auto byte = static_cast<uint8_t>(bytes[i]);
    if (num_needed_ == 0) {
      ++i;
      if (byte < 0x80) {
        out->push_back(static_cast<char>(byte));
        continue;
      }
      // Lead bytes and the second-byte ranges of the Unicode "well-formed byte
      // sequences" table; C0, C1 and F5..FF never start one, nor does a continuation.
      if (byte >= 0xC2 && byte <= 0xDF) {
        num_needed_ = 2;
      } else if (byte >= 0xE0 && byte <= 0xEF) {
        num_needed_ = 3;
        if (byte == 0xE0) lower_ = 0xA0;  // E0 80..9F would be overlong
        if (byte == 0xED) upper_ = 0x9F;  // ED A0..BF would be a surrogate
      } else if (byte >= 0xF0 && byte <= 0xF4) {
        num_needed_ = 4;
        if (byte == 0xF0) lower_ = 0x90;  // F0 80..8F would be overlong
        if (byte == 0xF4) upper_ = 0x8F;  // F4 90..BF would exceed U+10FFFF
      } else {
        out->append(kReplacement);
        continue;
      }
      held_[0] = static_cast<char>(byte);
      num_held_ = 1;
      continue;
    }
    if (byte < lower_ || byte > upper_) {
      // The held bytes are a maximal subpart: one U+FFFD for them all. The byte that
      // broke the sequence is not consumed: it may start the next character.
      reset_sequence();
      out->append(kReplacement);
      continue;
    }
    ++i;
    lower_ = 0x80;
    upper_ = 0xBF;
    if (num_held_ + 1 < num_needed_) {
      held_[num_held_++] = static_cast<char>(byte);
      continue;
    }
    out->append(held_.data(), num_held_);
    out->push_back(static_cast<char>(byte));
    reset_sequence();
  }
}

void Utf8StreamRepair::finish(std::string* out) {
  if (num_needed_ == 0) return;
  reset_sequence();
  out->append(kReplacement);
}

std::string sanitize_utf8(std::string_view text) {
  std::string out;
  Utf8StreamRepair repair;
  repair.append(text, &out);
  repair.finish(&out);
  return out;
}

std::string IncrementalDetokenizer::set_prompt(std::span<const TokenId> prompt) {
  repair_ = Utf8StreamRepair();
  before_first_printed_ = true;
  finished_ = false;
  text_.clear();
  for (const TokenId id : prompt) repair_.append(piece(id), &text_);
  return text_;
}

std::string IncrementalDetokenizer::push(TokenId id) {
  KVLM_CHECK(!finished_, "push({}) after finish(); call set_prompt() to start a new sequence", id);
  std::string out;
  repair_.append(piece(id), &out);
  text_ += out;
  return out;
}

std::string IncrementalDetokenizer::finish() {
  finished_ = true;
  std::string out;
  repair_.finish(&out);
  text_ += out;
  return out;
}

std::string IncrementalDetokenizer::piece(TokenId id) {
  if (before_first_printed_ && tokenizer_.token_type(id) != TokenType::kControl) {
    before_first_printed_ = false;
    // decode() of this one token applies the tokenizer's own first-token rule (the SPM
    // dummy-prefix space), which Tokenizer keeps private; restating it here could drift.
    return tokenizer_.decode({id});
  }
  return tokenizer_.token_to_piece(id);
}

}  // namespace kvlm
