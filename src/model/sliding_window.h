// SlidingWindowConfig: which layers of a model attend only to a recent window of tokens
// (Gemma 3's interleaved local layers), as its GGUF file states it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace kvlm {

class GgufFile;
struct KvStorageOptions;

// A local (sliding-window) layer's query at position p sees the keys at positions
// (p - window, p]: a key is visible iff p - key position < window. Its cache needs only
// those tokens; global layers see the whole sequence.
struct SlidingWindowConfig {
  int window = 0;                    // tokens; 0 = no local layers
  std::vector<uint8_t> local_layers; // [num_layers] 1 = local; empty when window == 0

  bool any() const { return window > 0; }
  bool is_local(int layer) const { return window > 0 && local_layers[static_cast<size_t>(layer)] != 0; }
  int num_local_layers() const;
};

// Gemma 3's rule when the file gives no pattern: every 6th layer (5, 11, ...) is global.
inline constexpr int kGemma3SlidingWindowPeriod = 6;

// Local layers from a period N: layer l is local unless l % N == N - 1 (N = 1: none local).
std::vector<uint8_t> local_layers_from_period(int period, int num_layers);

// Reads "<arch>.attention.sliding_window" and "<arch>.attention.sliding_window_pattern" (a
// period, or one bool/int per layer, 1 = local). gemma3 requires the window and defaults the
// pattern to kGemma3SlidingWindowPeriod; other architectures kvlm runs have no local layers
// (a file that names a window for them is refused, since kvlm would not apply it), except phi3,
// whose window (Phi-3-mini's 2047) llama.cpp does not apply either: none, and ModelConfig warns.
Result<SlidingWindowConfig> read_sliding_window(const GgufFile& file, const std::string& arch, int num_layers);

// The most local slots num_sequences sequences pin at once when one step of all of them
// together holds at most max_batch_tokens tokens: each its window's blocks, and the step's
// tokens once over the batch (a sequence stepping s tokens pins at most
// ceil((window - 1 + s) / block) + 1 <= local_blocks_per_sequence(window, block, 1) + 1 +
// ceil(s / block) - 1 blocks, and the ceil(s / block) add up to at most ceil(T / block) + n).
// 0 without local layers.
int64_t local_slots_needed(const SlidingWindowConfig& config, int block_size, int num_sequences,
                           int max_batch_tokens);

// Makes `options` keep only the windows of the local layers (KvStorageOptions::local_layers):
// local_slots_needed() slots, never more than the pool's num_blocks. No-op without local layers.
void keep_local_windows(const SlidingWindowConfig& config, int block_size, int num_sequences, int max_batch_tokens,
                        int num_blocks, KvStorageOptions& options);

}  // namespace kvlm
