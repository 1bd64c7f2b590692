#include "model/sliding_window.h"

#include <algorithm>

#include "gguf/gguf_file.h"
#include "kv/kv_storage.h"
#include "model/llama_gguf_names.h"

namespace kvlm {

namespace names = llama_names;

int SlidingWindowConfig::num_local_layers() const {
  if (window <= 0) return 0;
  return static_cast<int>(std::count(local_layers.begin(), local_layers.end(), uint8_t{1}));
}

std::vector<uint8_t> local_layers_from_period(int period, int num_layers) {
  std::vector<uint8_t> local(static_cast<size_t>(num_layers), 0);
  for (int l = 0; l < num_layers; ++l) local[static_cast<size_t>(l)] = l % period != period - 1 ? 1 : 0;
  return local;
}

Result<SlidingWindowConfig> read_sliding_window(const GgufFile& file, const std::string& arch, int num_layers) {
  SlidingWindowConfig config;
  const std::string window_key = names::key(arch, names::kSlidingWindow);
  const std::string pattern_key = names::key(arch, names::kSlidingWindowPattern);
  const GgufValue* window = file.find(window_key);
  if (arch == "phi3") return config;  // the caller warns: llama.cpp runs phi3 without its window too
  if (arch != "gemma3") {
    if (window != nullptr) {
      return Status::errorf("{}: '{}' is set, but kvlm runs every '{}' layer as full attention; refusing rather "
                            "than ignoring the window",
                            file.name(), window_key, arch);
    }
    return config;
  }
  if (window == nullptr) return Status::errorf("{}: missing metadata '{}' (gemma3 local layers)", file.name(), window_key);
  const std::optional<int64_t> w = window->as_int();
  if (!w || *w <= 0 || *w > (int64_t{1} << 24)) {
    return Status::errorf("{}: metadata '{}' = {} is out of range [1, {}]", file.name(), window_key,
                          window->to_display_string(), int64_t{1} << 24);
  }
  config.window = static_cast<int>(*w);

  const GgufValue* pattern = file.find(pattern_key);
  if (pattern == nullptr) {
    config.local_layers = local_layers_from_period(kGemma3SlidingWindowPeriod, num_layers);
  } else if (pattern->type() == GgufType::kArray) {
    if (static_cast<int>(pattern->elements().size()) != num_layers) {
      return Status::errorf("{}: metadata '{}' has {} entries for {} layers", file.name(), pattern_key,
                            pattern->elements().size(), num_layers);
    }
    for (const GgufValue& e : pattern->elements()) {
      const std::optional<int64_t> v = e.as_int();
      if (!v || (*v != 0 && *v != 1)) {
        return Status::errorf("{}: metadata '{}' must hold 0/1 (or bool) per layer, found {}", file.name(),
                              pattern_key, e.to_display_string());
      }
      config.local_layers.push_back(static_cast<uint8_t>(*v));
    }
  } else {
    const std::optional<int64_t> period = pattern->as_int();
    if (!period || *period < 1 || *period > num_layers + 1) {
      return Status::errorf("{}: metadata '{}' = {} is not a layer period in [1, {}]", file.name(), pattern_key,
                            pattern->to_display_string(), num_layers + 1);
    }
    config.local_layers = local_layers_from_period(static_cast<int>(*period), num_layers);
  }
  if (config.num_local_layers() == 0) {
    config.window = 0;
    config.local_layers.clear();
  }
  return config;
}

int64_t local_slots_needed(const SlidingWindowConfig& config, int block_size, int num_sequences,
                           int max_batch_tokens) {
  if (!config.any()) return 0;
  const int64_t n = std::max(1, num_sequences);
  const int64_t bs = block_size;
  const int64_t window_part = KvStorage::local_blocks_per_sequence(config.window, block_size, 1);
  return n * (window_part + 1) + (std::max<int64_t>(1, max_batch_tokens) + bs - 1) / bs;
}

void keep_local_windows(const SlidingWindowConfig& config, int block_size, int num_sequences, int max_batch_tokens,
                        int num_blocks, KvStorageOptions& options) {
  if (!config.any()) return;
  options.local_layers = config.local_layers;
  options.local_num_blocks = static_cast<int>(
      std::min<int64_t>(num_blocks, local_slots_needed(config, block_size, num_sequences, max_batch_tokens)));
}

}  // namespace kvlm
