// JinjaLexer: jinja2's lexing rules, written out by hand.
#include "chat/jinja_lexer.h"

#include <cstring>

#include <fmt/format.h>

#include "chat/python_text.h"
#include "model/unicode_utf8.h"

namespace kvlm::chat {

std::string normalize_template_newlines(std::string_view source) {
  // Python's str.splitlines() then "\n".join(): line breaks become "\n", a final one vanishes.
  std::string out;
  out.reserve(source.size());
  bool ends_with_break = false;
  for (size_t i = 0; i < source.size();) {
    const unsigned char c = static_cast<unsigned char>(source[i]);
    size_t break_len = 0;
    if (c == '\r') {
      break_len = (i + 1 < source.size() && source[i + 1] == '\n') ? 2 : 1;
    } else if (c == '\n' || c == '\v' || c == '\f' || c == 0x1C || c == 0x1D || c == 0x1E) {
      break_len = 1;
    } else if (c == 0xC2 && i + 1 < source.size() && static_cast<unsigned char>(source[i + 1]) == 0x85) {
      break_len = 2;
    } else if (c == 0xE2 && i + 2 < source.size() && static_cast<unsigned char>(source[i + 1]) == 0x80 &&
               (static_cast<unsigned char>(source[i + 2]) == 0xA8 || static_cast<unsigned char>(source[i + 2]) == 0xA9)) {
      break_len = 3;
    }
    if (break_len) {
      out += '\n';
      i += break_len;
      ends_with_break = true;
    } else {
      out += source[i];
      ++i;
      ends_with_break = false;
    }
  }
  if (ends_with_break) out.pop_back();
  return out;
}

std::string describe_position(std::string_view source, size_t offset) {
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < offset && i < source.size(); ++i) {
    if (source[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return fmt::format("line {}, column {}", line, offset - line_start + 1);
}

namespace {

// Length of the Python whitespace code point at `pos`, or 0.
size_t space_length_at(std::string_view s, size_t pos) {
  if (pos >= s.size()) return 0;
  const size_t len = utf8_sequence_length(s, pos);
  if (len == 0) return 0;
  return python_is_space(utf8_decode(s, pos, len)) ? len : 0;
}

size_t skip_spaces(std::string_view s, size_t pos) {
  while (size_t len = space_length_at(s, pos)) pos += len;
  return pos;
}

// Python's str.rstrip() (whitespace) over UTF-8.
std::string_view rstrip_spaces(std::string_view s) {
  return s.substr(0, python_strip(s, std::nullopt, StripSide::kRight).size());
}

bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python's "unicode-escape" decoding of a string literal's body, as jinja2 applies it.
Result<std::string> decode_string_escapes(std::string_view body) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out += body[i];
      continue;
    }
    const char e = body[++i];
    switch (e) {
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case '\n': break;  // a backslash-newline continues the line
      case 'x':
      case 'u':
      case 'U': {
        const size_t digits = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
        uint32_t cp = 0;
        for (size_t k = 1; k <= digits; ++k) {
          const int h = i + k < body.size() ? hex_value(body[i + k]) : -1;
          if (h < 0) return Status::errorf("truncated \\{} escape in a string literal", e);
          cp = cp * 16 + static_cast<uint32_t>(h);
        }
        if (cp > 0x10FFFF) return Status::error("illegal Unicode character in a \\U escape");
        out += from_code_point(cp);
        i += digits;
        break;
      }
      case 'N': return Status::error("unsupported construct: \\N{...} escape in a string literal");
      default:
        if (e >= '0' && e <= '7') {
          uint32_t cp = static_cast<uint32_t>(e - '0');
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k) {
            cp = cp * 8 + static_cast<uint32_t>(body[++i] - '0');
          }
          out += from_code_point(cp);
        } else {
          out += '\\';  // unknown escapes stay as written
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {}

  Result<std::vector<JinjaToken>> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      const size_t tag = find_tag(pos);
      if (tag == std::string_view::npos) {
        emit(JinjaTokenKind::kData, std::string(src_.substr(pos)), pos);
        break;
      }
      const char type = src_[tag + 1];  // '{', '%' or '#'
      const char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      std::string_view text = src_.substr(pos, tag - pos);
      if (sign == '-') {
        text = rstrip_spaces(text);
      } else if (sign != '+' && type != '{') {
        // lstrip_blocks: only spaces and tabs between the line start and the tag go.
        const size_t nl = text.rfind('\n');
        const size_t line_pos = nl == std::string_view::npos ? 0 : nl + 1;
        if (line_pos > 0 || line_starting) {
          if (text.find_first_not_of(" \t", line_pos) == std::string_view::npos) text = text.substr(0, line_pos);
        }
      }
      if (!text.empty()) emit(JinjaTokenKind::kData, std::string(text), pos);
      const size_t inner = tag + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      Result<size_t> next = type == '#' ? lex_comment(tag, inner)
                          : type == '%' ? lex_block(tag, inner)
                                        : lex_tag(tag, inner, JinjaTokenKind::kVariableBegin);
      if (!next.ok()) return next.status();
      pos = *next;
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    emit(JinjaTokenKind::kEnd, "", src_.size());
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t pos) const {
    while (true) {
      const size_t brace = src_.find('{', pos);
      if (brace == std::string_view::npos || brace + 1 >= src_.size()) return std::string_view::npos;
      const char c = src_[brace + 1];
      if (c == '{' || c == '%' || c == '#') return brace;
      pos = brace + 1;
    }
  }

  void emit(JinjaTokenKind kind, std::string text, size_t offset) {
    tokens_.push_back(JinjaToken{kind, std::move(text), offset});
  }

  Status error_at(size_t offset, std::string_view what) const {
    return Status::errorf("template syntax error at {}: {}", describe_position(src_, offset), what);
  }

  // After an end marker: "-" strips all following whitespace, "+" nothing, plain trims one "\n".
  size_t after_end(size_t end_pos, char sign, bool trims_newline) const {
    if (sign == '-') return skip_spaces(src_, end_pos);
    if (sign == '+' || !trims_newline) return end_pos;
    return (end_pos < src_.size() && src_[end_pos] == '\n') ? end_pos + 1 : end_pos;
  }

  Result<size_t> lex_comment(size_t tag, size_t inner) {
    const size_t end = src_.find("#}", inner);
    if (end == std::string_view::npos) return error_at(tag, "missing end of comment tag '#}'");
    const char sign = end > inner && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : '\0';
    return after_end(end + 2, sign, true);
  }

  Result<size_t> lex_block(size_t tag, size_t inner) {
    // {% raw %}...{% endraw %}: the body is data, untouched.
    size_t p = skip_spaces(src_, inner);
    if (src_.compare(p, 3, "raw") == 0 && !(p + 3 < src_.size() && is_name_char(src_[p + 3]))) {
      size_t q = skip_spaces(src_, p + 3);
      const char sign = q < src_.size() && src_[q] == '-' ? '-' : '\0';
      if (sign) ++q;
      if (src_.compare(q, 2, "%}") == 0) return lex_raw(tag, after_end(q + 2, sign, false));
    }
    return lex_tag(tag, inner, JinjaTokenKind::kBlockBegin);
  }

  Result<size_t> lex_raw(size_t tag, size_t body_start) {
    size_t search = body_start;
    while (true) {
      const size_t open = src_.find("{%", search);
      if (open == std::string_view::npos) return error_at(tag, "missing '{% endraw %}'");
      const char sign = open + 2 < src_.size() ? src_[open + 2] : '\0';
      size_t p = skip_spaces(src_, open + 2 + ((sign == '-' || sign == '+') ? 1 : 0));
      if (src_.compare(p, 6, "endraw") != 0) {
        search = open + 2;
        continue;
      }
      p = skip_spaces(src_, p + 6);
      char end_sign = '\0';
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) end_sign = src_[p++];
      if (src_.compare(p, 2, "%}") != 0) return error_at(open, "malformed '{% endraw %}'");
      std::string_view body = src_.substr(body_start, open - body_start);
      if (sign == '-') {
        body = rstrip_spaces(body);
      } else if (sign != '+') {
        const size_t nl = body.rfind('\n');
        const size_t line_pos = nl == std::string_view::npos ? 0 : nl + 1;
        if (line_pos > 0 && body.find_first_not_of(" \t", line_pos) == std::string_view::npos) {
          body = body.substr(0, line_pos);
        }
      }
      if (!body.empty()) emit(JinjaTokenKind::kData, std::string(body), body_start);
      return after_end(p + 2, end_sign, true);
    }
  }

  // Tokens inside {{ }} or {% %} up to the matching end marker (ignored inside brackets).
  Result<size_t> lex_tag(size_t tag, size_t pos, JinjaTokenKind begin_kind) {
    const bool block = begin_kind == JinjaTokenKind::kBlockBegin;
    emit(begin_kind, "", tag);
    const char end_char = block ? '%' : '}';
    std::string brackets;
    while (true) {
      pos = skip_spaces(src_, pos);
      if (pos >= src_.size()) return error_at(tag, block ? "missing end of block tag '%}'" : "missing end of print tag '}}'");
      if (brackets.empty()) {
        char sign = '\0';
        size_t end = pos;
        if ((src_[pos] == '-' || (block && src_[pos] == '+')) && pos + 1 < src_.size()) {
          sign = src_[pos];
          end = pos + 1;
        }
        if (src_.compare(end, 2, std::string{end_char, '}'}) == 0) {
          emit(block ? JinjaTokenKind::kBlockEnd : JinjaTokenKind::kVariableEnd, "", pos);
          return after_end(end + 2, sign, block);
        }
      }
      const char c = src_[pos];
      if (is_name_start(c)) {
        size_t end = pos + 1;
        while (end < src_.size() && is_name_char(src_[end])) ++end;
        emit(JinjaTokenKind::kName, std::string(src_.substr(pos, end - pos)), pos);
        pos = end;
      } else if (is_digit(c)) {
        KVLM_ASSIGN_OR_RETURN(pos, lex_number(pos));
      } else if (c == '\'' || c == '"') {
        KVLM_ASSIGN_OR_RETURN(pos, lex_string(pos));
      } else {
        static const char* const kOperators[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "/", "*", "%", "~",
                                                 "(",  ")",  "[",  "]",  "{",  "}",  ",", ".", ":", "|", "=", "<",
                                                 ">",  ";"};
        const char* op = nullptr;
        for (const char* candidate : kOperators) {
          if (src_.compare(pos, std::strlen(candidate), candidate) == 0) {
            op = candidate;
            break;
          }
        }
        if (!op) return error_at(pos, fmt::format("unexpected character '{}'", std::string(1, c)));
        const char o = op[0];
        if (op[1] == '\0' && (o == '(' || o == '[' || o == '{')) {
          brackets.push_back(o == '(' ? ')' : (o == '[' ? ']' : '}'));
        } else if (op[1] == '\0' && (o == ')' || o == ']' || o == '}')) {
          if (brackets.empty() || brackets.back() != o) return error_at(pos, fmt::format("unexpected '{}'", o));
          brackets.pop_back();
        }
        emit(JinjaTokenKind::kOperator, op, pos);
        pos += std::strlen(op);
      }
    }
  }

  Result<size_t> lex_number(size_t pos) {
    auto digits_from = [&](size_t p, std::string* out) {  // (\d+_)*\d+
      size_t q = p;
      while (q < src_.size() && is_digit(src_[q])) {
        while (q < src_.size() && is_digit(src_[q])) *out += src_[q++];
        if (q + 1 < src_.size() && src_[q] == '_' && is_digit(src_[q + 1])) ++q;
      }
      return q;
    };
    const size_t start = pos;
    std::string text;
    pos = digits_from(pos, &text);
    bool is_float = false;
    const bool after_dot = start > 0 && src_[start - 1] == '.';  // "x.0.1" is two lookups, not a float
    if (!after_dot) {
      if (pos + 1 < src_.size() && src_[pos] == '.' && is_digit(src_[pos + 1])) {
        text += '.';
        pos = digits_from(pos + 1, &text);
        is_float = true;
      }
      if (pos < src_.size() && (src_[pos] == 'e' || src_[pos] == 'E')) {
        size_t q = pos + 1;
        std::string exponent = "e";
        if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) exponent += src_[q++];
        if (q < src_.size() && is_digit(src_[q])) {
          pos = digits_from(q, &exponent);
          text += exponent;
          is_float = true;
        }
      }
    }
    emit(is_float ? JinjaTokenKind::kFloat : JinjaTokenKind::kInteger, text, start);
    return pos;
  }

  Result<size_t> lex_string(size_t pos) {
    const char quote = src_[pos];
    size_t q = pos + 1;
    while (q < src_.size() && src_[q] != quote) {
      if (src_[q] == '\\') ++q;
      ++q;
    }
    if (q >= src_.size()) return error_at(pos, "unterminated string literal");
    auto decoded = decode_string_escapes(src_.substr(pos + 1, q - pos - 1));
    if (!decoded.ok()) return error_at(pos, decoded.status().message());
    emit(JinjaTokenKind::kString, std::move(decoded).value(), pos);
    return q + 1;
  }

  std::string_view src_;
  std::vector<JinjaToken> tokens_;
};

}  // namespace

Result<std::vector<JinjaToken>> lex_template(std::string_view source) { return Lexer(source).run(); }

}  // namespace kvlm::chat
