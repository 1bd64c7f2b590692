// The planner's prediction for a finished run, printed beside the live pool's bytes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_error.h"
#include "kv/kv_type.h"
#include "model/model_config.h"
#include "plan/kv_planner.h"
#include "plan/model_shape.h"

namespace kvlm::cli {

// What `kvlm plan` predicts for sequences of these lengths, against the bytes the live pool held.
// The two agree when formula <= live <= formula + slack (one partially filled block per sequence
// and layer); anything else is an accounting bug, which the CLI tests assert never happens.
// KIVI's f32 staging (the tail block and the residual window) is outside the blocks: the live peak
// must not exceed the planner's bound for one sequence.
struct PlannerCheck {
  PoolPrediction predicted;
  uint64_t live_bytes = 0;
  uint64_t live_staging_bytes = 0;

  bool agrees() const {
    const double live = static_cast<double>(live_bytes);
    return live >= predicted.formula_bytes &&
           live <= predicted.formula_bytes + static_cast<double>(predicted.slack_bytes) &&
           live_staging_bytes <= predicted.staging_bytes;
  }

  std::string line() const {
    return fmt::format("KV planner       predicts {:.0f} bytes by formula, {} in whole blocks (slack {}); live pool "
                       "{} bytes: {}\n",
                       predicted.formula_bytes, predicted.block_bytes, predicted.slack_bytes, live_bytes,
                       agrees() ? "agrees" : "DISAGREES") +
           (predicted.staging_bytes > 0
                ? fmt::format("KIVI staging     {} bytes at the peak; planner bound {} bytes per sequence\n",
                              live_staging_bytes, predicted.staging_bytes)
                : std::string());
  }

  nlohmann::json json() const {
    return {{"formula_bytes", predicted.formula_bytes},
            {"block_bytes", predicted.block_bytes},
            {"slack_bytes", predicted.slack_bytes},
            {"live_bytes", live_bytes},
            {"staging_bytes", predicted.staging_bytes},
            {"live_staging_bytes", live_staging_bytes},
            {"agrees", agrees()}};
  }
};

// How the run's pool held sliding-window layers: every token (a pool without local slots), or only
// the windows, with steps of at most max_step_tokens (the peak a local layer reaches is the
// window plus the longest step).
struct LocalLayerRun {
  LocalLayerBlocks blocks = LocalLayerBlocks::kEveryToken;
  int64_t max_step_tokens = 1;
};

inline PlannerCheck check_against_planner(const ModelConfig& config, KvType k_type, KvType v_type, int block_size,
                                          const std::vector<int64_t>& tokens_per_sequence, uint64_t live_bytes,
                                          int kivi_residual = 0, uint64_t live_staging_bytes = 0,
                                          int evicted_slot_blocks = 0, LocalLayerRun local = {}) {
  PlannerCheck check;
  if (config.sliding_window.any() && local.blocks == LocalLayerBlocks::kWindow) {
    PoolQuery query;
    query.k_type = k_type;
    query.v_type = v_type;
    query.block_size = block_size;
    query.kivi_residual_tokens = kivi_residual;
    query.local_blocks = LocalLayerBlocks::kWindow;
    for (int64_t tokens : tokens_per_sequence) {
      query.sequences.push_back({tokens, std::min(tokens, std::max<int64_t>(1, local.max_step_tokens))});
    }
    check.predicted = value_or_throw(predict_pool_bytes(model_shape_from_config(config), query));
  } else {
    // An MLA model's pool holds the latent rows alone.
    const CacheForm form = config.is_mla() ? CacheForm::kLatent : CacheForm::kFull;
    check.predicted = value_or_throw(predict_pool_bytes(model_shape_from_config(config), k_type, v_type, form,
                                                        block_size, tokens_per_sequence, kivi_residual));
  }
  // Window and streaming leave evicted slots in at most two blocks per sequence (the sinks' last
  // block and the window's first) until a whole block is evicted and dropped.
  check.predicted.slack_bytes += static_cast<uint64_t>(evicted_slot_blocks) * tokens_per_sequence.size() *
                                 check.predicted.footprint.bytes_per_block;
  check.live_bytes = live_bytes;
  check.live_staging_bytes = live_staging_bytes;
  return check;
}

}  // namespace kvlm::cli
