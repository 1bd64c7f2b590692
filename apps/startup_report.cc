#include "startup_report.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "cli_error.h"
#include "core/rng.h"
#include "engine/generator.h"

namespace kvlm::cli {

std::string describe_load(const ModelLoadStats& load) {
  const double file_mb = static_cast<double>(load.file_bytes) / 1e6;
  const double resident = load.file_bytes ? 100.0 * static_cast<double>(load.resident_bytes_before) / load.file_bytes : 0;
  if (!load.mapped) {
    return fmt::format("load {:.3f} s: {:.2f} MB from memory (copied to aligned storage)", load.seconds, file_mb);
  }
  return fmt::format("load {:.3f} s: {:.2f} MB mapped ({:.0f}% in the page cache before), {:.2f} MB copied "
                     "(norms, biases, derived matrices; the rest used in place)",
                     load.seconds, file_mb, resident, static_cast<double>(load.copied_bytes) / 1e6);
}

nlohmann::json load_json(const ModelLoadStats& load) {
  return {{"seconds", load.seconds},
          {"file_bytes", load.file_bytes},
          {"resident_bytes_before", load.resident_bytes_before},
          {"copied_bytes", load.copied_bytes},
          {"mapped", load.mapped}};
}

FirstToken time_first_token(LlamaModel& model, ThreadPool& pool, int prompt_tokens, KvType k_type, KvType v_type,
                            uint64_t seed) {
  const ModelConfig& c = model.config();
  FirstToken first;
  first.prompt_tokens = std::clamp(prompt_tokens, 1, std::max(1, c.context_length - 1));
  Rng rng(seed);
  std::vector<TokenId> prompt(static_cast<size_t>(first.prompt_tokens));
  for (TokenId& t : prompt) t = static_cast<TokenId>(rng.next_u64() % static_cast<uint64_t>(c.vocab_size));
  GenerationOptions options;
  options.max_tokens = 1;
  options.sampler.temperature = 0;
  options.k_type = k_type;
  options.v_type = v_type;
  options.stop_at_eos = false;
  Generator generator(model, pool);
  const GenerationResult r = value_or_throw(generator.generate(prompt, options, Generator::TextCallback{}));
  first.seconds = r.stats.prefill_seconds;
  return first;
}

}  // namespace kvlm::cli
