// Unicode normalization for tokenizers whose tokenizer.json normalizes text (Qwen2: NFC).
#pragma once

#include <string>
#include <string_view>

namespace kvlm {

// `text` in Normalization Form C (utf8proc). Bytes that are not valid UTF-8 are kept as
// they are and split the text: each valid run between them is normalized on its own, so
// any byte string is accepted and nothing is lost.
std::string nfc_normalize(std::string_view text);

// True when nfc_normalize(text) == text; cheap for ASCII, which NFC never changes.
bool is_nfc(std::string_view text);

}  // namespace kvlm
