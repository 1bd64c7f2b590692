// Printing a generation's statistics, as text (--stats) or JSON (--json).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "engine/generator.h"
#include "evict/eviction_options.h"
#include "kv/kv_type.h"

namespace kvlm {
class LlamaModel;
}

namespace kvlm::cli {

struct RunDescription {
  std::string model_path;
  KvType k_type = KvType::kF32;
  KvType v_type = KvType::kF32;
  uint64_t seed = 0;
  int kivi_residual = 0;
  EvictionOptions eviction;
  int prefill_chunk = 256;  // the longest step: what a sliding-window layer holds beyond its window
};

std::string format_stats(const GenerationResult& result, const LlamaModel& model, const RunDescription& run);
nlohmann::json stats_to_json(const GenerationResult& result, const LlamaModel& model, const RunDescription& run);

}  // namespace kvlm::cli
