#include "model/tokenizer_gguf.h"

#include <limits>
#include <string_view>

#include "model/llama_gguf_names.h"

namespace kvlm {
namespace {

namespace names = llama_names;

// A special-token id; absent keys keep `fallback`. llama.cpp's converter writes
// "no token" as uint32 0xFFFFFFFF.
Result<int32_t> read_token_id(const GgufFile& file, std::string_view key, int32_t fallback) {
  if (file.find(key) == nullptr) return fallback;
  KVLM_ASSIGN_OR_RETURN(const int64_t value, file.get_int(key));
  if (value == -1 || value == int64_t{std::numeric_limits<uint32_t>::max()}) return -1;
  if (value < 0 || value > std::numeric_limits<int32_t>::max()) {
    return Status::errorf("{} = {} is not a token id", key, value);
  }
  return static_cast<int32_t>(value);
}

Result<bool> read_bool(const GgufFile& file, std::string_view key, bool fallback) {
  if (file.find(key) == nullptr) return fallback;
  return file.get_bool(key);
}

bool is_llama3_pre(std::string_view pre) {
  return pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe" || pre == "falcon3" || pre == "pixtral";
}

Result<TokenizerVocab> read_vocab(const GgufFile& file) {
  TokenizerVocab vocab;
  KVLM_ASSIGN_OR_RETURN(vocab.model, file.get_string(names::kTokModel));
  if (file.find(names::kTokPre) != nullptr) {
    KVLM_ASSIGN_OR_RETURN(vocab.pre, file.get_string(names::kTokPre));
  }
  KVLM_ASSIGN_OR_RETURN(vocab.tokens, file.get_string_array(names::kTokTokens));
  if (file.find(names::kTokScores) != nullptr) {
    KVLM_ASSIGN_OR_RETURN(vocab.scores, file.get_float_array(names::kTokScores));
  }
  if (file.find(names::kTokTypes) != nullptr) {
    KVLM_ASSIGN_OR_RETURN(const std::vector<int64_t> types, file.get_int_array(names::kTokTypes));
    vocab.token_types.reserve(types.size());
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] < std::numeric_limits<int32_t>::min() || types[i] > std::numeric_limits<int32_t>::max()) {
        return Status::errorf("{}[{}] = {} is not a token type", names::kTokTypes, i, types[i]);
      }
      vocab.token_types.push_back(static_cast<int32_t>(types[i]));
    }
  }
  if (file.find(names::kTokMerges) != nullptr) {
    KVLM_ASSIGN_OR_RETURN(vocab.merges, file.get_string_array(names::kTokMerges));
  }

  const bool is_spm = vocab.model == "llama";
  KVLM_ASSIGN_OR_RETURN(vocab.bos_id, read_token_id(file, names::kTokBos, is_spm ? 1 : -1));
  KVLM_ASSIGN_OR_RETURN(vocab.eos_id, read_token_id(file, names::kTokEos, is_spm ? 2 : -1));
  KVLM_ASSIGN_OR_RETURN(vocab.unk_id, read_token_id(file, names::kTokUnk, is_spm ? 0 : -1));
  KVLM_ASSIGN_OR_RETURN(vocab.pad_id, read_token_id(file, names::kTokPad, -1));
  KVLM_ASSIGN_OR_RETURN(vocab.add_bos, read_bool(file, names::kTokAddBos, is_spm || is_llama3_pre(vocab.pre)));
  KVLM_ASSIGN_OR_RETURN(vocab.add_space_prefix, read_bool(file, names::kTokAddSpacePrefix, is_spm));
  return vocab;
}

}  // namespace

Result<TokenizerVocab> load_tokenizer_vocab(const GgufFile& file) {
  Result<TokenizerVocab> vocab = read_vocab(file);
  if (!vocab.ok()) return vocab.status().with_context(fmt::format("{}: tokenizer", file.name()));
  return vocab;
}

}  // namespace kvlm
