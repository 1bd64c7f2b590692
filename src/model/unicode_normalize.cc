#include "model/unicode_normalize.h"

#include <utf8proc.h>

#include <cstdlib>

#include "model/unicode_utf8.h"

namespace kvlm {
namespace {

bool is_ascii(std::string_view text) {
  for (const char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

// NFC of a run that is valid UTF-8 (utf8proc rejects anything else).
void append_nfc_of_valid(std::string_view run, std::string* out) {
  if (run.empty()) return;
  if (is_ascii(run)) {
    out->append(run);
    return;
  }
  utf8proc_uint8_t* normalized = nullptr;
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(run.data()), static_cast<utf8proc_ssize_t>(run.size()),
                   &normalized, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (length < 0) {
    out->append(run);  // unreachable for valid UTF-8 but out of memory: keep the text
  } else {
    out->append(reinterpret_cast<const char*>(normalized), static_cast<size_t>(length));
  }
  std::free(normalized);
}

}  // namespace

std::string nfc_normalize(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  if (is_valid_utf8(text)) {
    append_nfc_of_valid(text, &out);
    return out;
  }
  size_t run_begin = 0;
  for (size_t pos = 0; pos < text.size();) {
    const size_t length = utf8_sequence_length(text, pos);
    if (length > 0) {
      pos += length;
      continue;
    }
    append_nfc_of_valid(text.substr(run_begin, pos - run_begin), &out);
    out.push_back(text[pos++]);
    run_begin = pos;
  }
  append_nfc_of_valid(text.substr(run_begin), &out);
  return out;
}

bool is_nfc(std::string_view text) { return is_ascii(text) || nfc_normalize(text) == text; }

}  // namespace kvlm
