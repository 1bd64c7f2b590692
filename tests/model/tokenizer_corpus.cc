#include "model/tokenizer_corpus.h"

#include <cstdint>

namespace kvlm::testing {
namespace {

// splitmix64: portable and fixed, unlike std:: distributions.
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return static_cast<size_t>(next() % n); }
};

// Text in many shapes. NFD forms are spelled with combining marks; Hangul as conjoining jamo.
const char* const kFragments[] = {
    // prose and contractions
    "Hello", "hello world", "The quick brown fox jumps over the lazy dog.", "don't", "DON'T", "Don'T", "I'm", "I'M",
    "we'll", "WE'LL", "they're", "THEY'RE", "she'd", "SHE'D", "it's", "IT'S", "you've", "YOU'VE", "rock'n'roll",
    "'s", "'t", "'S", "'ll", "o'clock", "l'homme", "ſ's 'ſ", "CamelCaseWord", "snake_case_name", "ALLCAPS", "aBcDeF",
    // digits and numbers
    "7", "42", "123", "2024", "31415", "1234567", "12345678901", "3.14159", "1,000,000", "-0.5e10", "0x1F", "v1.2.3",
    "$100", "€5,99", "¥1000", "50%", "½", "²", "①②③", "Ⅻ", "٣٤٥", "१२३", "１２３",
    // whitespace
    " ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", " \n ", "\n \n", " \t\n", "\u00a0",
    "\u3000", "\u2009", "\v", "\f", "a\u0085b", "a\ufeffb", " \ufeff", "a\u00adb", "x\u200by", "\u2028\u2029",
    // code
    "int main() {", "return x+1;", "for (int i = 0; i < n; ++i) {", "def f(x):\n    return x ** 2\n",
    "std::vector<int> v;", "#include <stdio.h>", "a->b", "x == y && z != w", "// comment", "/* block */",
    "<div class=\"x\">text</div>", "SELECT * FROM t WHERE id = 1;", "{\"key\": [1, 2.5, null]}", "if (a) { b(); }",
    "    indented", "\tTabbed", "$ ls -la | grep foo", "print(f\"{x!r}\")", "```python", "x[i][j] += 1",
    // urls and addresses
    "https://example.com/path?q=1&r=two#frag", "http://localhost:8080/", "user@example.org", "www.kvlm.dev/docs",
    "C:\\Users\\name\\file.txt", "/usr/local/bin",
    // punctuation
    "!!!", "...", "?!", "---", "—", "–", "“quoted”", "‘single’", "«guillemets»", "(parens)", "[brackets]",
    "{braces}", "@#$%^&*", "~`|\\", "。", "、", "！", "？", "：",
    // emoji, incl. modifiers, ZWJ sequences, flags and variation selectors
    "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇫🇷", "✨", "🤖🧠", "👩🏽‍💻", "☃",
    // CJK
    "中文", "你好，世界", "日本語のテキスト", "カタカナ", "ひらがな", "漢字と仮名", "한국어", "안녕하세요", "龍",
    "ｈａｌｆｗｉｄｔｈ ＡＢＣ",
    // other scripts
    "مرحبا بالعالم", "السَّلَامُ عَلَيْكُمْ", "नमस्ते दुनिया", "हिन्दी", "Привет, мир", "Ελληνικά", "עברית",
    "ภาษาไทย", "Tiếng Việt", "ქართული", "Ἀθῆναι",
    // combining marks: NFC and NFD spellings of the same text
    "café", "cafe\u0301", "Ångström", "A\u030angstro\u0308m", "ñ", "n\u0303", "ệ", "e\u0323\u0302", "ḱ", "k\u0301",
    "\u0627\u064e", "\u0915\u093f", "x\u0301\u0302\u0303",
    // Hangul as conjoining jamo (NFD) and as syllables (NFC)
    "\u1112\u1161\u11ab\u1100\u1173\u11af", "한글", "\u1100\u1161\u11a8", "각",
    // look-alike special text
    "<|fake|>", "<|im_start", "</s", "<s >", "[INST]", "<<SYS>>",
};

const char* const kSeparators[] = {"", " ", " ", " ", "  ", "\n", "\n\n", "\t", ", ", ". ", " - ", "\r\n"};

const char* const kContractions[] = {"s", "t", "re", "ve", "m", "ll", "d"};

// Code point ranges random strings are drawn from: scripts, marks, spaces and symbols
// whose Unicode properties (\p{L}, \p{N}, \s, \p{M}) the pre-tokenizers test.
const char32_t kRanges[][2] = {
    {0x20, 0x7E},     {0xA0, 0xFF},     {0x100, 0x24F},   {0x300, 0x36F},   {0x370, 0x3FF},   {0x400, 0x4FF},
    {0x590, 0x5FF},   {0x600, 0x6FF},   {0x900, 0x97F},   {0xE00, 0xE7F},   {0x1100, 0x11FF}, {0x2000, 0x206F},
    {0x2070, 0x209F}, {0x20A0, 0x20CF}, {0x2100, 0x214F}, {0x2150, 0x218F}, {0x2200, 0x22FF}, {0x2460, 0x24FF},
    {0x3000, 0x303F}, {0x3040, 0x30FF}, {0x4E00, 0x9FFF}, {0xAC00, 0xD7A3}, {0xFF00, 0xFFEF}, {0x1F300, 0x1F6FF},
    {0x1F900, 0x1F9FF}, {0x1D400, 0x1D7FF},
};

void append_utf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string upper(std::string s) {
  for (char& c : s) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return s;
}

}  // namespace

std::vector<std::string> make_tokenizer_corpus(const std::vector<std::string>& special_texts) {
  std::vector<std::string> corpus;
  std::vector<std::string> fragments(std::begin(kFragments), std::end(kFragments));

  for (const std::string& f : fragments) {
    corpus.push_back(f);
    corpus.push_back(" " + f);
    corpus.push_back(f + " ");
    corpus.push_back("  " + f + "\n");
    corpus.push_back("x" + f + "x");
  }
  for (const char* run : {" ", "\n", "\t", "\r\n", " \n", "\u00a0"}) {
    std::string text;
    for (int length = 1; length <= 16; ++length) {
      text += run;
      corpus.push_back(text);
      corpus.push_back("a" + text + "b");
    }
  }
  std::string digits;
  for (int length = 1; length <= 40; ++length) {
    digits.push_back(static_cast<char>('0' + (length * 7) % 10));
    corpus.push_back(digits);
    corpus.push_back("x" + digits + " " + digits + ".5");
  }
  for (const char* c : kContractions) {
    const std::string lower = std::string("'") + c;
    for (const std::string& suffix : {lower, upper(lower), std::string("'") + upper(std::string(c, 1)) + (c + 1)}) {
      corpus.push_back("word" + suffix);
      corpus.push_back("WORD" + suffix + " next");
      corpus.push_back(suffix);
    }
  }
  for (const std::string& special : special_texts) {
    corpus.push_back(special);
    corpus.push_back("Text before " + special + " and after.");
    corpus.push_back(special + special + "\n" + special);
    corpus.push_back("x" + special + "y");
  }

  Rng rng{0x6b766c6d};  // "kvlm"
  for (int i = 0; i < 1600; ++i) {
    std::string text;
    const size_t num_parts = 1 + rng.below(8);
    for (size_t p = 0; p < num_parts; ++p) {
      if (p > 0) text += kSeparators[rng.below(std::size(kSeparators))];
      // Prose mostly; special token text in about one part in ten.
      const bool special = !special_texts.empty() && rng.below(10) == 0;
      text += special ? special_texts[rng.below(special_texts.size())] : fragments[rng.below(fragments.size())];
    }
    corpus.push_back(text);
  }
  // Random code points, a few ranges per string, so letters, marks, digits, spaces and
  // symbols of many scripts meet in every order.
  for (int i = 0; i < 600; ++i) {
    std::string text;
    const size_t num_code_points = 1 + rng.below(16);
    const auto* range = kRanges[rng.below(std::size(kRanges))];
    for (size_t c = 0; c < num_code_points; ++c) {
      if (rng.below(4) == 0) range = kRanges[rng.below(std::size(kRanges))];
      append_utf8(range[0] + static_cast<char32_t>(rng.below(range[1] - range[0] + 1)), &text);
    }
    corpus.push_back(text);
  }
  return corpus;
}

}  // namespace kvlm::testing
