#include "support/tokenizer_json_gguf.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <optional>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gguf/gguf_writer.h"
#include "model/llama_gguf_names.h"
#include "model/token_type.h"

namespace kvlm::testing {
namespace {

using nlohmann::json;
namespace names = llama_names;

Result<json> read_json(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::errorf("{}: cannot open", path.string());
  json value = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return Status::errorf("{}: not valid JSON", path.string());
  return value;
}

// A token named in tokenizer_config.json: a string or an AddedToken object.
std::optional<std::string> config_token(const json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

bool is_byte_piece(const std::string& text) {
  const auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F') || (c >= 'a' && c <= 'f'); };
  return text.size() == 6 && text.compare(0, 3, "<0x") == 0 && hex(text[3]) && hex(text[4]) && text[5] == '>';
}

// True when a normalizer (or one inside a Sequence) prepends "▁": SentencePiece's dummy prefix.
bool prepends_space_marker(const json& normalizer) {
  if (!normalizer.is_object()) return false;
  const std::string type = normalizer.value("type", "");
  if (type == "Prepend") return normalizer.value("prepend", "") == "\xE2\x96\x81";
  if (type == "Sequence" && normalizer.contains("normalizers")) {
    for (const json& inner : normalizer["normalizers"]) {
      if (prepends_space_marker(inner)) return true;
    }
  }
  return false;
}

// Whether the post-processor's single-sequence template begins with a special token (BOS).
bool template_adds_bos(const json& post) {
  if (!post.is_object()) return false;
  const std::string type = post.value("type", "");
  if (type == "TemplateProcessing" && post.contains("single") && !post["single"].empty()) {
    return post["single"][0].contains("SpecialToken");
  }
  if (type == "Sequence" && post.contains("processors")) {
    for (const json& inner : post["processors"]) {
      if (template_adds_bos(inner)) return true;
    }
  }
  return false;
}

Result<std::string> merge_text(const json& merge, size_t rank) {
  if (merge.is_string()) return merge.get<std::string>();
  if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
    return merge[0].get<std::string>() + " " + merge[1].get<std::string>();
  }
  return Status::errorf("merge {} is neither \"a b\" nor [\"a\", \"b\"]", rank);
}

Status convert(const json& tok, const json& config, const std::string& pre, const std::filesystem::path& out_path) {
  const json& model = tok["model"];
  if (!model.is_object() || model.value("type", "") != "BPE" || !model.contains("vocab")) {
    return Status::error("tokenizer.json: only BPE models are converted");
  }
  const bool is_spm = model.value("byte_fallback", false);
  const json& vocab = model["vocab"];
  const json& added = tok.contains("added_tokens") ? tok["added_tokens"] : json::array();

  int64_t num_tokens = 0;
  for (const auto& [text, id] : vocab.items()) num_tokens = std::max<int64_t>(num_tokens, id.get<int64_t>() + 1);
  for (const json& a : added) num_tokens = std::max<int64_t>(num_tokens, a["id"].get<int64_t>() + 1);
  if (num_tokens <= 0 || num_tokens > std::numeric_limits<int32_t>::max()) {
    return Status::errorf("tokenizer.json: {} tokens", num_tokens);
  }
  std::vector<std::string> tokens(static_cast<size_t>(num_tokens));
  std::vector<int32_t> types(tokens.size(), static_cast<int32_t>(TokenType::kUnused));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = fmt::format("[PAD{}]", i);
  for (const auto& [text, id] : vocab.items()) {
    const auto i = id.get<size_t>();
    tokens[i] = text;
    types[i] = static_cast<int32_t>(is_spm && is_byte_piece(text) ? TokenType::kByte : TokenType::kNormal);
  }
  for (const json& a : added) {
    const auto i = a["id"].get<size_t>();
    tokens[i] = a["content"].get<std::string>();
    types[i] = static_cast<int32_t>(a.value("special", false) ? TokenType::kControl : TokenType::kUserDefined);
  }
  std::unordered_map<std::string, int32_t> ids;
  for (size_t i = 0; i < tokens.size(); ++i) ids[tokens[i]] = static_cast<int32_t>(i);
  const auto id_of = [&](const std::optional<std::string>& text) -> int32_t {
    if (!text) return -1;
    const auto it = ids.find(*text);
    return it == ids.end() ? -1 : it->second;
  };
  int32_t unk_id = -1;
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    unk_id = id_of(model["unk_token"].get<std::string>());
    if (unk_id >= 0) types[unk_id] = static_cast<int32_t>(TokenType::kUnknown);
  }

  std::vector<std::string> merges;
  if (model.contains("merges")) {
    for (size_t rank = 0; rank < model["merges"].size(); ++rank) {
      KVLM_ASSIGN_OR_RETURN(std::string merge, merge_text(model["merges"][rank], rank));
      merges.push_back(std::move(merge));
    }
  }

  GgufWriter writer;
  writer.set_string(names::kTokModel, is_spm ? "llama" : "gpt2");
  if (!is_spm) writer.set_string(names::kTokPre, pre);
  writer.set(names::kTokTokens, GgufValue::string_array(tokens));
  writer.set(names::kTokTypes, GgufValue::i32_array(types));
  if (is_spm) {
    // Rank order as scores: the SPM merge takes the highest score, BPE the lowest rank.
    const float below_all = -static_cast<float>(merges.size() + 1);
    std::vector<float> scores(tokens.size(), below_all);
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      const std::string& merge = merges[rank];
      const size_t space = merge.find(' ', 1);
      if (space == std::string::npos) continue;
      const auto it = ids.find(merge.substr(0, space) + merge.substr(space + 1));
      if (it != ids.end() && scores[it->second] == below_all) scores[it->second] = -static_cast<float>(rank);
    }
    writer.set(names::kTokScores, GgufValue::f32_array(scores));
    writer.set_bool(names::kTokAddSpacePrefix, prepends_space_marker(tok["normalizer"]));
  } else {
    writer.set(names::kTokMerges, GgufValue::string_array(merges));
  }
  // "No token" is written as the converters do, so the loader's reading of it is covered.
  const auto set_id = [&](const char* key, int32_t id) {
    writer.set_u32(key, id >= 0 ? static_cast<uint32_t>(id) : std::numeric_limits<uint32_t>::max());
  };
  set_id(names::kTokBos, id_of(config_token(config, "bos_token")));
  set_id(names::kTokEos, id_of(config_token(config, "eos_token")));
  set_id(names::kTokUnk, unk_id);
  const auto add_bos = config.find("add_bos_token");
  writer.set_bool(names::kTokAddBos, add_bos != config.end() && add_bos->is_boolean()
                                         ? add_bos->get<bool>()
                                         : template_adds_bos(tok["post_processor"]));
  return writer.write(out_path.string());
}

}  // namespace

Status write_tokenizer_json_gguf(const std::filesystem::path& model_dir, const std::string& pre,
                                 const std::filesystem::path& out_path) {
  KVLM_ASSIGN_OR_RETURN(const json tok, read_json(model_dir / "tokenizer.json"));
  KVLM_ASSIGN_OR_RETURN(const json config, read_json(model_dir / "tokenizer_config.json"));
  try {
    return convert(tok, config, pre, out_path);
  } catch (const json::exception& e) {
    return Status::errorf("{}: unexpected tokenizer.json layout: {}", model_dir.string(), e.what());
  }
}

}  // namespace kvlm::testing
