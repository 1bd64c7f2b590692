// Start-up as users feel it: loading (a mapping: fast, but cold pages move the cost to the first
// forward) and the time to the first token after it. `kvlm run --stats` and `kvlm bench` print it.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/thread_pool.h"
#include "kv/kv_type.h"
#include "model/llama_model.h"

namespace kvlm::cli {

// "load 0.012 s: 1.70 GB mapped in place (100% in the page cache before), 0.31 MB copied (norms, ...)"
std::string describe_load(const ModelLoadStats& load);
nlohmann::json load_json(const ModelLoadStats& load);

struct FirstToken {
  int prompt_tokens = 0;
  double seconds = 0;  // from the start of the prompt's prefill to the first sampled token
};

// Generates one token greedily after `prompt_tokens` token ids (seeded, not BOS-led): the first
// forward after load, which on a cold cache faults the weights in.
FirstToken time_first_token(LlamaModel& model, ThreadPool& pool, int prompt_tokens, KvType k_type, KvType v_type,
                            uint64_t seed);

}  // namespace kvlm::cli
