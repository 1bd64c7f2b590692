#include "model/unicode_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <cstdint>

#include "core/check.h"
#include "model/unicode_utf8.h"

namespace kvlm {
namespace {

// Stands in for each invalid byte while matching: one byte long, so offsets carry over,
// and in the same class as U+FFFD for every pattern we use ([^\s\p{L}\p{N}]).
constexpr char kInvalidByteStandIn = '\x01';

// JIT matching of long runs can exceed PCRE2's default 32 KiB JIT stack; this bounds
// the stack a single match may grow to before falling back to the interpreter.
constexpr size_t kJitStackStartBytes = 32 * 1024;
constexpr size_t kJitStackMaxBytes = 8 * 1024 * 1024;

}  // namespace

struct UnicodeRegex::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Compiled() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

UnicodeRegex::UnicodeRegex(std::string pattern, RegexUnit unit, std::unique_ptr<Compiled> compiled)
    : pattern_(std::move(pattern)), unit_(unit), compiled_(std::move(compiled)) {}
UnicodeRegex::UnicodeRegex(UnicodeRegex&&) noexcept = default;
UnicodeRegex& UnicodeRegex::operator=(UnicodeRegex&&) noexcept = default;
UnicodeRegex::~UnicodeRegex() = default;

Result<UnicodeRegex> UnicodeRegex::compile(std::string pattern, RegexUnit unit) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  const uint32_t options = unit == RegexUnit::kCodePoint ? (PCRE2_UTF | PCRE2_UCP) : 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                                   &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    std::array<PCRE2_UCHAR, 256> message{};
    pcre2_get_error_message(error_code, message.data(), message.size());
    return Status::errorf("regex '{}' does not compile at offset {}: {}", pattern, error_offset,
                          reinterpret_cast<const char*>(message.data()));
  }
  auto compiled = std::make_unique<Compiled>();
  compiled->code = code;
  // JIT is an optimization only: without it (unsupported CPU/build) the interpreter runs.
  compiled->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return UnicodeRegex(std::move(pattern), unit, std::move(compiled));
}

void UnicodeRegex::split(std::string_view text, std::vector<std::string_view>* pieces) const {
  if (text.empty()) return;
  // PCRE2 in UTF mode rejects invalid UTF-8, so match over a copy with stand-ins.
  const bool utf = unit_ == RegexUnit::kCodePoint;
  std::string sanitized;
  std::string_view subject = text;
  if (utf && !is_valid_utf8(text)) {
    sanitized.assign(text);
    for (size_t pos = 0; pos < sanitized.size();) {
      const size_t length = utf8_sequence_length(sanitized, pos);
      if (length == 0) {
        sanitized[pos++] = kInvalidByteStandIn;
      } else {
        pos += length;
      }
    }
    subject = sanitized;
  }

  pcre2_match_data* match_data = pcre2_match_data_create_from_pattern(compiled_->code, nullptr);
  KVLM_CHECK(match_data != nullptr, "out of memory creating PCRE2 match data");
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;

  const auto* subject_ptr = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t offset = 0;
  while (offset < subject.size()) {
    int rc = pcre2_match(compiled_->code, subject_ptr, subject.size(), offset, utf ? PCRE2_NO_UTF_CHECK : 0,
                         match_data, context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && jit_stack == nullptr) {
      // Rare (very long runs): retry this match with a bigger JIT stack.
      context = pcre2_match_context_create(nullptr);
      jit_stack = pcre2_jit_stack_create(kJitStackStartBytes, kJitStackMaxBytes, nullptr);
      KVLM_CHECK(context != nullptr && jit_stack != nullptr, "out of memory creating a PCRE2 JIT stack");
      pcre2_jit_stack_assign(context, nullptr, jit_stack);
      continue;
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    // Any other failure (resource limits on pathological input) must not lose text: the
    // remainder becomes one piece, which the BPE model still encodes byte-exactly.
    if (rc < 0) break;
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data);
    size_t start = ovector[0];
    size_t end = ovector[1];
    if (start > offset) pieces->push_back(text.substr(offset, start - offset));  // unmatched gap
    if (end == start) {
      // An empty match would loop forever; take one unit instead.
      if (start >= subject.size()) break;
      const size_t length = utf ? utf8_sequence_length(subject, start) : 1;
      end = start + (length == 0 ? 1 : length);
      if (end > subject.size()) end = subject.size();
    }
    pieces->push_back(text.substr(start, end - start));
    offset = end;
  }
  if (offset < text.size()) pieces->push_back(text.substr(offset));

  if (jit_stack != nullptr) pcre2_jit_stack_free(jit_stack);
  if (context != nullptr) pcre2_match_context_free(context);
  pcre2_match_data_free(match_data);
}

}  // namespace kvlm
