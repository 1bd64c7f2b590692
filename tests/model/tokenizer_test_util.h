// Test helpers shared by the tokenizer tests: the llama2.c tok512.bin vocabulary and file reading.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "core/status.h"
#include "model/tokenizer.h"
#include "model/unicode_utf8.h"

namespace kvlm::testing {

inline std::string read_file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Parses llama2.c's tokenizer format (int32 max_token_length, then per id: float32 score,
// int32 length, bytes) into the SentencePiece vocabulary it was exported from: llama2.c
// stores "▁" as ' ' and BOS/EOS as "\n<s>\n" / "\n</s>\n".
inline Result<TokenizerVocab> read_llama2c_vocab(const std::filesystem::path& path, int vocab_size) {
  const std::string bytes = read_file_bytes(path);
  size_t pos = 0;
  const auto read = [&](void* dst, size_t n) {
    if (pos + n > bytes.size()) return false;
    std::memcpy(dst, bytes.data() + pos, n);
    pos += n;
    return true;
  };
  int32_t max_token_length = 0;
  if (!read(&max_token_length, 4)) return Status::errorf("{}: truncated header", path.string());
  TokenizerVocab vocab;
  vocab.model = "llama";
  for (int id = 0; id < vocab_size; ++id) {
    float score = 0;
    int32_t length = 0;
    if (!read(&score, 4) || !read(&length, 4) || length < 0 || pos + static_cast<size_t>(length) > bytes.size()) {
      return Status::errorf("{}: truncated at token {}", path.string(), id);
    }
    std::string text = bytes.substr(pos, static_cast<size_t>(length));
    pos += static_cast<size_t>(length);
    std::string piece;
    for (const char c : text) {
      if (c == ' ') {
        piece += "\xE2\x96\x81";
      } else {
        piece.push_back(c);
      }
    }
    TokenType type = TokenType::kNormal;
    if (id == 0) {
      type = TokenType::kUnknown;
    } else if (id == 1 || id == 2) {
      type = TokenType::kControl;
      piece = id == 1 ? "<s>" : "</s>";
    } else if (id < 3 + 256) {
      type = TokenType::kByte;
    }
    vocab.tokens.push_back(std::move(piece));
    vocab.scores.push_back(score);
    vocab.token_types.push_back(static_cast<int32_t>(type));
  }
  if (pos != bytes.size()) return Status::errorf("{}: {} bytes left after {} tokens", path.string(), bytes.size() - pos, vocab_size);
  vocab.unk_id = 0;
  vocab.bos_id = 1;
  vocab.eos_id = 2;
  return vocab;
}

// The story in the shared models README: the fenced block after the greedy-decoding line.
inline std::string readme_story(const std::filesystem::path& readme) {
  const std::string text = read_file_bytes(readme);
  const size_t fence = text.find("```\n");
  if (fence == std::string::npos) return {};
  const size_t begin = fence + 4;
  const size_t end = text.find("\n```", begin);
  if (end == std::string::npos) return {};
  return text.substr(begin, end - begin);
}

// The merge rule written the obvious O(n^2) way: rescan all adjacent pairs, merge the
// best (highest score, leftmost), repeat; then byte fallback. The oracle for encode().
inline std::vector<TokenId> reference_spm_encode(const TokenizerVocab& vocab, std::string_view text, bool add_bos) {
  std::unordered_map<std::string, TokenId> pieces, pieces_by_text;
  for (size_t i = 0; i < vocab.tokens.size(); ++i) {
    pieces_by_text[vocab.tokens[i]] = static_cast<TokenId>(i);
    const auto type = static_cast<TokenType>(vocab.token_types[i]);
    if (type == TokenType::kNormal || type == TokenType::kUserDefined) pieces[vocab.tokens[i]] = static_cast<TokenId>(i);
  }
  std::vector<TokenId> ids;
  if (add_bos) ids.push_back(vocab.bos_id);
  if (text.empty()) return ids;
  std::string escaped = vocab.add_space_prefix ? "\xE2\x96\x81" : "";
  for (const char c : text) escaped += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
  std::vector<std::string> symbols;
  for (size_t pos = 0; pos < escaped.size();) {
    const size_t length = std::max<size_t>(1, utf8_sequence_length(escaped, pos));
    symbols.push_back(escaped.substr(pos, length));
    pos += length;
  }
  while (true) {
    float best_score = -std::numeric_limits<float>::infinity();
    int best = -1;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const auto it = pieces.find(symbols[i] + symbols[i + 1]);
      if (it != pieces.end() && (best < 0 || vocab.scores[it->second] > best_score)) {
        best_score = vocab.scores[it->second];
        best = static_cast<int>(i);
      }
    }
    if (best < 0) break;
    symbols[best] += symbols[best + 1];
    symbols.erase(symbols.begin() + best + 1);
  }
  for (const std::string& symbol : symbols) {
    if (auto it = pieces.find(symbol); it != pieces.end()) {
      ids.push_back(it->second);
    } else {
      for (const char c : symbol) {
        const auto byte = pieces_by_text.find(fmt::format("<0x{:02X}>", static_cast<uint8_t>(c)));
        if (byte != pieces_by_text.end()) {
          ids.push_back(byte->second);
        } else if (vocab.unk_id >= 0) {
          ids.push_back(vocab.unk_id);
        }
      }
    }
  }
  return ids;
}

}  // namespace kvlm::testing
