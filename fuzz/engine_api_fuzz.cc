// Fuzz target engine_api: the Engine's public API (engine/engine.h) driven by a fuzzed sequence of
// submit / step / cancel with random options, on tiny synthesized models and pools small enough
// that requests queue, get preempted and recompute.
// Input: engine options, then operations until the bytes run out (at most kMaxOps).
// Asserted: a submit either fails with a message or the request later gets exactly one final
// event and no event after it; at the end (everything cancelled or finished) the pool has no
// leaked block, no sequence is left, and the cache's invariants hold (they are also checked
// after every step).
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cache/kv_cache_manager.h"
#include "core/check.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "fuzz/fuzz_input.h"
#include "fuzz/fuzz_targets.h"
#include "fuzz/fuzz_temp_dir.h"
#include "model/llama_model.h"
#include "model/model_synthesizer.h"

namespace kvlm::fuzz {
namespace {

constexpr int kMaxOps = 48;
constexpr int kMaxSteps = 160;  // forwards per input, so one input stays well under a second

// Every model is synthesized once per process: two llama shapes, and gemma3's sliding-window
// layers (whose blocks the engine keeps per window).
LlamaModel& model(int index) {
  static const char* kPresets[] = {"tiny-mha", "tiny-gqa", "gemma3-tiny"};
  static std::unique_ptr<LlamaModel> models[std::size(kPresets)];
  auto& slot = models[index % std::size(kPresets)];
  if (!slot) {
    SynthOptions options;
    options.shape = synth_preset(kPresets[index % std::size(kPresets)]).value();
    options.out_path = (fuzz_temp_dir() / (std::string(kPresets[index % std::size(kPresets)]) + ".gguf")).string();
    options.num_threads = 1;
    const Status written = synthesize_model(options);
    KVLM_CHECK(written.ok(), "synthesize: {}", written.message());
    slot = LlamaModel::load(options.out_path).value();
  }
  return *slot;
}

ThreadPool& thread_pool() {
  static ThreadPool pool(1);
  return pool;
}

constexpr KvType kKvTypes[] = {KvType::kF16, KvType::kF32, KvType::kBf16, KvType::kFp8,
                               KvType::kInt8, KvType::kInt4, KvType::kKivi4, KvType::kKivi2};

EngineOptions engine_options(FuzzInput& in) {
  EngineOptions o;
  o.k_type = kKvTypes[in.take_byte() % std::size(kKvTypes)];
  o.v_type = (in.take_byte() & 1) != 0 ? o.k_type : kKvTypes[in.take_byte() % std::size(kKvTypes)];
  o.block_size = 1 << in.take_int(1, 5);  // 2..32
  o.num_blocks = in.take_int(1, 64);
  o.max_batch_tokens = in.take_int(1, 96);
  o.max_seqs = in.take_int(1, 8);
  o.prefix_caching = in.take_bool();
  if (in.take_bool()) o.storage.kivi_residual_tokens = in.take_int(0, 64);
  if (in.take_bool()) o.storage.rotate_keys = in.take_bool();
  return o;
}

EvictionOptions eviction_options(FuzzInput& in) {
  EvictionOptions e;
  const uint8_t which = in.take_byte();
  if (which % 2 == 0) return e;  // half the requests keep every token
  e.policy = static_cast<EvictionPolicy>(1 + (which >> 1) % 4);
  e.budget = in.take_int(0, 96);
  e.sinks = in.take_int(0, 8);
  e.recent = in.take_int(0, 48);
  e.snapkv_window = in.take_int(0, 40);
  e.snapkv_kernel = in.take_int(0, 9);
  e.evicting_step = in.take_int(0, 8);
  return e;
}

// A prompt of token ids (now and then one outside the vocabulary) or of text.
void fill_prompt(FuzzInput& in, int vocab_size, RequestOptions& r) {
  const uint8_t kind = in.take_byte();
  if (kind % 8 == 0) {
    r.prompt_text = in.take_string(64);
    r.parse_special = (kind & 8) != 0;
    return;
  }
  const int length = kind % 8 == 1 ? in.take_int(0, 300) : in.take_int(1, 40);
  // A few shared starts make prefix-cache hits likely.
  const uint32_t base = in.take_byte() % 4;
  for (int i = 0; i < length; ++i) {
    r.prompt.push_back(static_cast<TokenId>(i < 24 ? (base * 31 + i * 7) % vocab_size : in.take_byte() % vocab_size));
  }
  if (kind % 8 == 2 && !r.prompt.empty()) r.prompt.back() = in.take_bool() ? vocab_size : -1;
}

RequestOptions request_options(FuzzInput& in, int vocab_size) {
  RequestOptions r;
  fill_prompt(in, vocab_size, r);
  r.max_tokens = in.take_int(-1, 24);
  r.stop_at_eos = in.take_bool();
  r.sampler.temperature = in.take_float(-0.5f, 2.0f);
  r.sampler.top_k = in.take_int(-1, 64);
  r.sampler.top_p = in.take_float(-0.1f, 1.1f);
  r.sampler.min_p = in.take_float(-0.1f, 1.1f);
  r.sampler.repeat_penalty = in.take_float(0.0f, 3.0f);
  r.sampler.repeat_last_n = in.take_int(-1, 64);
  r.sampler.seed = in.take_u32();
  if (in.take_bool()) r.stop_tokens.push_back(in.take_int(-1, vocab_size));
  if (in.take_bool()) r.stop_strings.push_back(in.take_string(4));
  r.eviction = eviction_options(in);
  r.priority = in.take_int(-2, 2);
  const uint8_t salt = in.take_byte() % 4;
  if (salt != 0) r.cache_salt = std::string(salt, 's');
  r.logits = static_cast<LogitsCapture>(in.take_byte() % 3);
  return r;
}

// What the target knows of one accepted request, from its events.
struct Tracked {
  int num_final = 0;
  bool event_after_final = false;
};

}  // namespace

int engine_api_one_input(const uint8_t* data, size_t size) {
  FuzzInput in(data, size);
  LlamaModel& m = model(in.take_byte());
  auto created = Engine::create(m, thread_pool(), engine_options(in));
  if (!created.ok()) {
    KVLM_CHECK(!created.status().message().empty(), "Engine::create failed without a message");
    return 0;
  }
  Engine& engine = *created.value();
  const int vocab_size = m.tokenizer().vocab_size();
  // Held by pointer so callbacks stay valid while the map grows.
  std::map<int32_t, std::unique_ptr<Tracked>> requests;
  std::vector<RequestId> ids;
  int num_steps = 0;
  const auto step = [&] {
    if (num_steps >= kMaxSteps) return;
    ++num_steps;
    engine.step();
    engine.cache().check_invariants();
  };

  for (int op = 0; op < kMaxOps && !in.empty(); ++op) {
    switch (in.take_byte() % 5) {
      case 0:
      case 1: {
        RequestOptions r = request_options(in, vocab_size);
        auto tracked = std::make_unique<Tracked>();
        Tracked* t = tracked.get();
        // Some requests cancel themselves from their own callback (allowed: callbacks may cancel).
        const int cancel_after = in.take_bool() ? in.take_int(1, 6) : -1;
        auto num_events = std::make_shared<int>(0);
        Engine* e = &engine;
        auto id = engine.submit(std::move(r), [t, cancel_after, num_events, e](const TokenEvent& ev) {
          if (t->num_final > 0) t->event_after_final = true;
          if (ev.finish != FinishReason::kNone) {
            ++t->num_final;
            return;
          }
          if (++*num_events == cancel_after) e->cancel(ev.id);
        });
        if (!id.ok()) {
          KVLM_CHECK(!id.status().message().empty(), "submit failed without a message");
          break;
        }
        requests[id->value] = std::move(tracked);
        ids.push_back(*id);
        break;
      }
      case 2:
        if (!ids.empty()) {
          engine.cancel(ids[in.take_byte() % ids.size()]);
        } else {
          KVLM_CHECK(!engine.cancel(RequestId(in.take_int(0, 8))), "cancelled a request never submitted");
        }
        break;
      default:
        for (int n = in.take_int(1, 8); n > 0; --n) step();
        break;
    }
  }
  // Everything ends: what is still in flight is cancelled, then the engine drains.
  for (const RequestId id : ids) engine.cancel(id);
  engine.run_until_idle();
  engine.cache().check_invariants();
  KVLM_CHECK(engine.leaked_blocks() == 0, "{} blocks leaked", engine.leaked_blocks());
  KVLM_CHECK(engine.cache().num_sequences() == 0, "{} sequences left in the cache", engine.cache().num_sequences());
  KVLM_CHECK(engine.cache().num_free_blocks() == engine.cache().num_blocks(), "{} of {} blocks free at the end",
             engine.cache().num_free_blocks(), engine.cache().num_blocks());
  for (const auto& [id, t] : requests) {
    KVLM_CHECK(t->num_final == 1, "request {} got {} final events", id, t->num_final);
    KVLM_CHECK(!t->event_after_final, "request {} got an event after its final one", id);
  }
  KVLM_CHECK(!engine.step(), "work left after run_until_idle");
  return 0;
}

}  // namespace kvlm::fuzz

KVLM_LIBFUZZER_ENTRY(kvlm::fuzz::engine_api_one_input)
