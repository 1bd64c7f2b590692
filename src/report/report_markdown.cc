#include "report/report_markdown.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include <fmt/format.h>

namespace kvlm {
namespace {

bool has_plot(const std::vector<std::string>& plots, const std::string& name) {
  return std::find(plots.begin(), plots.end(), name) != plots.end();
}

void picture(std::string& md, const std::vector<std::string>& plots, const std::string& name, const char* alt) {
  if (has_plot(plots, name)) md += fmt::format("\n![{}]({})\n", alt, name);
}

// 1,234,567
std::string grouped(uint64_t n) {
  std::string digits = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string kv_label(const ReportOption& o) { return o.k_type == o.v_type ? o.k_type : o.k_type + " / " + o.v_type; }

// The bytes one sequence holds under each eviction policy: the planner's bound against the peak.
void eviction_memory_rows(std::string& md, const ReportData& d) {
  if (d.eviction_memory.empty()) return;
  md += fmt::format("\n### Bytes held under token eviction\n\n"
                    "One sequence fed {} tokens (the stream below, f32 codec). The planner bounds an evicting "
                    "sequence at min(tokens, budget) resident tokens; the peak is what the live pool held, measured "
                    "after every forward. Window and streaming may hold up to two blocks of evicted slots not yet "
                    "dropped. SnapKV runs each stream chunk whole as a prompt and compresses after it, so during "
                    "that forward it holds up to budget + chunk tokens, which a measurement after the forward does "
                    "not see: its pool must be sized for them.\n\n",
                    grouped(static_cast<uint64_t>(d.eviction_memory.front().tokens)));
  md += "| option | budget | bytes held (planner) | peak bytes (measured) | peak / planner | vs full cache |\n"
        "|---|---:|---:|---:|---:|---:|\n";
  for (const EvictionMemoryRow& r : d.eviction_memory) {
    const double ratio = r.planned_bytes > 0 ? static_cast<double>(r.peak_bytes) / r.planned_bytes : 0.0;
    const double vs_full = r.full_cache_bytes > 0 ? static_cast<double>(r.peak_bytes) / r.full_cache_bytes : 0.0;
    md += fmt::format("| {} | {} | {} | {} | {:.3f} | {:.4f}× |\n", r.option.label,
                      r.option.evicts() ? std::to_string(r.option.budget) : std::string("–"), grouped(r.planned_bytes),
                      grouped(r.peak_bytes), ratio, vs_full);
  }
}

void memory_section(std::string& md, const ReportData& d, const std::vector<std::string>& plots) {
  if (d.memory.empty()) return;
  md += "\n## Memory per token\n\n";
  md += fmt::format("K + V bytes one token takes over all {} layers (scales and other metadata included). The planner's "
                    "figure is `kvlm plan`'s formula; the live figure comes from the KV pool built for that codec.\n\n",
                    d.model.num_layers);
  md += "KIVI options also hold their newest tokens (the residual window, rounded up to whole blocks, plus the "
        "block being filled) in f32 staging: a fixed cost per sequence, listed separately.\n\n";
  md += "int8 and int4 keys are stored Hadamard-rotated (queries rotated alike, so attention is unchanged) so that "
        "their per-token scale is not spent on outlier channels; the `unrotated` rows store the same codec's keys "
        "as they come (`--kv-rotate off`). Rotation costs no bytes.\n\n";
  md += "| option | K / V codec | bytes/token (planner) | bytes/token (live pool) | vs f16 | f32 staging per sequence |\n"
        "|---|---|---:|---:|---:|---:|\n";
  for (const MemoryRow& r : d.memory) {
    md += fmt::format("| {} | {} | {} | {} | {:.3f}× | {} |\n", r.option.label, kv_label(r.option),
                      grouped(r.planned_bytes_per_token), grouped(r.live_bytes_per_token), r.ratio_to_f16,
                      r.staging_bytes_per_sequence > 0 ? grouped(r.staging_bytes_per_sequence) : std::string("–"));
  }
  picture(md, plots, "memory_per_token.png", "KV bytes per token for each option");
  eviction_memory_rows(md, d);
}

void quality_section(std::string& md, const ReportData& d, const std::vector<std::string>& plots) {
  if (d.quality.empty()) return;
  md += "\n## Quality: perplexity and KL divergence against the f32 cache\n\n";
  md += fmt::format("`kvlm eval ppl` windows of {} tokens (llama.cpp's convention: second half of each window scored), "
                    "{} tokens scored per option. KLD is KL(f32 cache ‖ option) per scored token, in nats.\n\n",
                    d.quality_ctx, grouped(static_cast<uint64_t>(d.quality.front().tokens_scored)));
  md += "| option | PPL | ΔPPL | mean KLD | KLD p99 | top-1 agreement | RMS Δp | peak KV bytes (with staging) |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const QualityRow& r : d.quality) {
    if (r.baseline) {
      md += fmt::format("| {} (baseline) | {:.4f} ± {:.4f} | – | – | – | – | – | {} |\n", r.option.label, r.ppl,
                        r.ppl_stderr, grouped(r.kv_bytes_peak));
    } else {
      md += fmt::format("| {} | {:.4f} ± {:.4f} | {:+.4f}% | {:.3g} | {:.3g} | {:.2f}% | {:.3f}% | {} |\n",
                        r.option.label, r.ppl, r.ppl_stderr, r.delta_ppl_pct, r.mean_kld, r.kld_p99,
                        100 * r.top1_agreement, 100 * r.rms_dp, grouped(r.kv_bytes_peak));
    }
  }
  picture(md, plots, "quality.png", "Delta perplexity and mean KLD per option");
}

void stream_section(std::string& md, const ReportData& d, const std::vector<std::string>& plots) {
  if (d.stream.empty()) return;
  md += "\n## Stream perplexity over length\n\n";
  md += fmt::format("One continuous stream, no resets, perplexity per segment of {} predicted tokens. "
                    "The model was trained on {} tokens of context; rows marked † lie past it.\n\n",
                    d.stream_segment, d.stream_trained_ctx);
  md += "| tokens |";
  for (const StreamRun& run : d.stream) md += fmt::format(" {} |", run.option.label);
  md += "\n|---|";
  for (size_t i = 0; i < d.stream.size(); ++i) md += "---:|";
  md += "\n";
  const size_t rows = d.stream.front().segments.size();
  for (size_t s = 0; s < rows; ++s) {
    const StreamSegmentRow& seg = d.stream.front().segments[s];
    md += fmt::format("| {}–{}{} |", seg.begin, seg.end, seg.end > d.stream_trained_ctx ? " †" : "");
    for (const StreamRun& run : d.stream) {
      md += s < run.segments.size() ? fmt::format(" {:.3f} |", run.segments[s].ppl) : std::string(" – |");
    }
    md += "\n";
  }
  md += "| overall |";
  for (const StreamRun& run : d.stream) md += fmt::format(" {:.3f} |", run.overall_ppl);
  md += "\n| KV bytes at the end |";
  for (const StreamRun& run : d.stream) {
    md += fmt::format(" {} |", run.segments.empty() ? std::string("–") : grouped(run.segments.back().kv_bytes));
  }
  md += "\n";
  picture(md, plots, "stream_ppl.png", "Perplexity per segment along the stream");
}

// Segment table of several stream runs: one column per run, rows marked † past the trained context.
void stream_table(std::string& md, const ReportData& d, const std::vector<StreamRun>& runs) {
  md += "| tokens |";
  for (const StreamRun& run : runs) md += fmt::format(" {} |", run.option.label);
  md += "\n|---|";
  for (size_t i = 0; i < runs.size(); ++i) md += "---:|";
  md += "\n";
  const size_t rows = runs.front().segments.size();
  for (size_t s = 0; s < rows; ++s) {
    const StreamSegmentRow& seg = runs.front().segments[s];
    md += fmt::format("| {}–{}{} |", seg.begin, seg.end, seg.end > d.stream_trained_ctx ? " †" : "");
    for (const StreamRun& run : runs) {
      md += s < run.segments.size() ? fmt::format(" {:.3f} |", run.segments[s].ppl) : std::string(" – |");
    }
    md += "\n";
  }
}

std::string ppl_or_dash(double ppl) { return ppl > 0 ? fmt::format("{:.3f}", ppl) : std::string("–"); }

// First segment whose perplexity exceeds `factor` × the run's in-context perplexity; -1 if none.
int first_segment_above(const StreamRun& run, double factor) {
  for (size_t s = 0; s < run.segments.size(); ++s) {
    if (run.segments[s].ppl > factor * run.in_context_ppl) return static_cast<int>(s);
  }
  return -1;
}

const StreamRun* find_policy_run(const std::vector<StreamRun>& runs, const std::string& policy) {
  for (const StreamRun& run : runs) {
    if (run.option.policy == policy) return &run;
  }
  return nullptr;
}

void stream_policies_section(std::string& md, const ReportData& d, const std::vector<std::string>& plots) {
  const std::vector<StreamRun>& runs = d.stream_policies;
  if (runs.empty() || runs.front().segments.empty()) return;
  md += "\n## Stream perplexity under token eviction\n\n";
  md += fmt::format(
      "The same stream as above, f32 codec, under each policy at a budget of {} tokens: window keeps the newest "
      "tokens; streaming (StreamingLLM) keeps the first few tokens (attention sinks) plus the newest; H2O keeps the "
      "newest half and the tokens with the most accumulated attention; SnapKV compresses after every prompt step, "
      "and since the stream is fed in chunks every chunk is a prompt step. Once the budget is full the policies "
      "evict token by token. Keys keep the rotation of their text position: window and streaming only ever hold "
      "tokens less than a budget back (streaming scores its sinks with a query rotated at its position within "
      "the cache), while H2O and SnapKV may keep old tokens, whose distance from the query grows past the trained "
      "context as in the full cache. Perplexity per segment of {} predictions; † marks segments past the trained "
      "context ({} tokens).\n\n",
      d.evict_stream_budget, d.stream_segment, d.stream_trained_ctx);
  stream_table(md, d, runs);
  md += "| in-context PPL |";
  for (const StreamRun& run : runs) md += fmt::format(" {} |", ppl_or_dash(run.in_context_ppl));
  md += "\n| past-context PPL |";
  for (const StreamRun& run : runs) md += fmt::format(" {} |", ppl_or_dash(run.past_context_ppl));
  md += "\n| overall PPL |";
  for (const StreamRun& run : runs) md += fmt::format(" {:.3f} |", run.overall_ppl);
  md += "\n| peak KV bytes |";
  for (const StreamRun& run : runs) md += fmt::format(" {} |", grouped(run.kv_bytes_peak));
  md += "\n| seconds |";
  for (const StreamRun& run : runs) md += fmt::format(" {:.1f} |", run.seconds);
  md += "\n";
  picture(md, plots, "stream_ppl_policies.png", "Perplexity per segment along the stream, one line per policy");

  // Statements derived from the numbers above.
  md += "\n";
  const StreamRun& full = runs.front();
  const int collapse = first_segment_above(full, 2.0);
  if (collapse >= 0) {
    const StreamSegmentRow& seg = full.segments[static_cast<size_t>(collapse)];
    md += fmt::format("- The full cache's segment perplexity first exceeds twice its in-context value ({:.3f}) in "
                      "segment {}–{} ({:.3f}); its past-context perplexity is {:.1f}× its in-context one.\n",
                      full.in_context_ppl, seg.begin, seg.end, seg.ppl,
                      full.in_context_ppl > 0 ? full.past_context_ppl / full.in_context_ppl : 0.0);
  } else {
    md += fmt::format("- The full cache's segment perplexity stays below twice its in-context value ({:.3f}) over "
                      "the whole stream.\n",
                      full.in_context_ppl);
  }
  for (size_t i = 1; i < runs.size(); ++i) {
    const StreamRun& run = runs[i];
    // Bytes held once the budget is full: from the first segment that starts past it.
    uint64_t lo = UINT64_MAX, hi = 0;
    for (const StreamSegmentRow& seg : run.segments) {
      if (seg.begin < run.option.budget) continue;
      lo = std::min(lo, seg.kv_bytes);
      hi = std::max(hi, seg.kv_bytes);
    }
    const int above = first_segment_above(run, 2.0);
    const double ratio = run.in_context_ppl > 0 ? run.past_context_ppl / run.in_context_ppl : 0.0;
    md += ratio >= 2 ? fmt::format("- {}: past-context perplexity {:.1f}× its in-context value", run.option.label, ratio)
                     : fmt::format("- {}: past-context perplexity {:+.1f}% against in-context", run.option.label,
                                   100 * (ratio - 1));
    md += above >= 0 ? fmt::format(" (first above twice in-context at {})", run.segments[static_cast<size_t>(above)].begin)
                     : std::string(", never twice it in any segment");
    if (hi > 0) {
      md += fmt::format("; bytes held at segment ends {}–{} ({:.1f}% spread), peak {} = {:.2f}% of the full cache's",
                        grouped(lo), grouped(hi), 100.0 * static_cast<double>(hi - lo) / static_cast<double>(hi),
                        grouped(run.kv_bytes_peak),
                        full.kv_bytes_peak > 0 ? 100.0 * run.kv_bytes_peak / static_cast<double>(full.kv_bytes_peak) : 0.0);
    }
    md += ".\n";
  }
  const StreamRun* window = find_policy_run(runs, "window");
  const StreamRun* streaming = find_policy_run(runs, "streaming");
  if (window != nullptr && streaming != nullptr) {
    double worst = 0;
    int64_t worst_begin = 0;
    const size_t n = std::min(window->segments.size(), streaming->segments.size());
    for (size_t s = 0; s < n; ++s) {
      const double diff = std::abs(streaming->segments[s].ppl / window->segments[s].ppl - 1);
      if (diff > worst) {
        worst = diff;
        worst_begin = window->segments[s].begin;
      }
    }
    md += fmt::format(
        "- Streaming and window differ by at most {:.2f}% in any segment (largest at {}); overall {:.3f} against "
        "{:.3f}. StreamingLLM reports that large models collapse under a plain window because they park attention on "
        "the first tokens (attention sinks); whether this model does is measured next.\n",
        100 * worst, worst_begin, streaming->overall_ppl, window->overall_ppl);
  }
  if (!d.sink_probe.empty()) {
    md += "\nAttention the first token receives (f32 full cache, summed over all layers and heads, averaged over "
          "the queries), against the share it would get if every query spread its attention evenly over the tokens "
          "before it:\n\n| queries | first-token share | uniform share | ratio |\n|---|---:|---:|---:|\n";
    for (const SinkProbeRow& r : d.sink_probe) {
      md += fmt::format("| {}–{} | {:.3f}% | {:.3f}% | {:.2f} |\n", r.query_begin, r.query_end,
                        100 * r.first_token_share, 100 * r.uniform_share,
                        r.uniform_share > 0 ? r.first_token_share / r.uniform_share : 0.0);
    }
    double max_ratio = 0;
    for (const SinkProbeRow& r : d.sink_probe) {
      if (r.uniform_share > 0) max_ratio = std::max(max_ratio, r.first_token_share / r.uniform_share);
    }
    md += max_ratio < 1.0
              ? fmt::format("\nThe first token gets less than a uniform share at every probed depth (at most {:.2f}× "
                            "it): this model keeps no attention sink there, so evicting the first tokens costs it "
                            "nothing, and keeping them (streaming) buys nothing over the window.\n",
                            max_ratio)
              : fmt::format("\nThe first token gets up to {:.2f}× a uniform share: a window that evicts it removes "
                            "attention the model relies on, which the sinks of streaming keep.\n",
                            max_ratio);
  }
}

void quality_policies_section(std::string& md, const ReportData& d, const std::vector<std::string>& plots) {
  if (d.quality_policies.empty()) return;
  int sinks = 0;
  std::string kivi_note;
  for (const QualityRow& r : d.quality_policies) {
    if (r.option.sinks > 0) sinks = r.option.sinks;
    if (r.option.k_type.starts_with("kivi") && kivi_note.empty()) {
      kivi_note = fmt::format(" (KIVI's residual window must stay below the budget of {}, so it is {} tokens "
                              "instead of the paper's 128)",
                              r.option.budget, r.option.kivi_residual);
    }
  }
  md += "\n### Quality under token eviction\n\n";
  md += fmt::format(
      "The same windows of {} tokens and the same f32 full-cache baseline, each window through an evicting sequence "
      "whose budget is a fraction of the window. The unscored first half is fed as one prompt, then the scored "
      "half token by token once the budget is full, so every scored token sees at most the budget. SnapKV is the "
      "exception: it compresses the first half (the prompt) to the budget using the attention of the prompt's last "
      "`snapkv_window` tokens (min(32, budget / 4), always below the budget), and the scored half then runs as a "
      "second prompt step, whole, with full attention over the compressed cache and itself; its numbers read "
      "\"compress the context, then answer\", not \"decode under a budget\". Streaming keeps {} sinks; H2O keeps "
      "the newest budget / 2 tokens. The composed rows combine a policy with a quantized codec{}.\n\n",
      d.quality_ctx, sinks, kivi_note);
  md += "| option | policy | budget | of ctx | PPL | ΔPPL | mean KLD | KLD p99 | top-1 agreement | peak KV bytes |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const QualityRow& r : d.quality_policies) {
    md += fmt::format("| {} | {} | {} | {:.1f}% | {:.4f} ± {:.4f} | {:+.3f}% | {:.3g} | {:.3g} | {:.2f}% | {} |\n",
                      r.option.label, r.option.policy, r.option.budget,
                      d.quality_ctx > 0 ? 100.0 * r.option.budget / d.quality_ctx : 0.0, r.ppl, r.ppl_stderr,
                      r.delta_ppl_pct, r.mean_kld, r.kld_p99, 100 * r.top1_agreement, grouped(r.kv_bytes_peak));
  }
  // Per budget (f32 rows only): the policy that costs least and the one that costs most among those
  // that decode under the budget; SnapKV answers with full attention, so it is named apart.
  std::vector<int> budgets;
  for (const QualityRow& r : d.quality_policies) {
    if (r.option.k_type == "f32" && std::find(budgets.begin(), budgets.end(), r.option.budget) == budgets.end()) {
      budgets.push_back(r.option.budget);
    }
  }
  md += "\n";
  for (int budget : budgets) {
    const QualityRow* best = nullptr;
    const QualityRow* worst = nullptr;
    const QualityRow* snapkv = nullptr;
    for (const QualityRow& r : d.quality_policies) {
      if (r.option.k_type != "f32" || r.option.budget != budget) continue;
      if (r.option.policy == "snapkv") {
        snapkv = &r;
        continue;
      }
      if (best == nullptr || r.delta_ppl_pct < best->delta_ppl_pct) best = &r;
      if (worst == nullptr || r.delta_ppl_pct > worst->delta_ppl_pct) worst = &r;
    }
    md += fmt::format("- Budget {} ({:.1f}% of the window):", budget,
                      d.quality_ctx > 0 ? 100.0 * budget / d.quality_ctx : 0.0);
    if (best != nullptr) {
      md += fmt::format(" decoding under the budget, least costly {} ({:+.2f}%, KLD {:.3g}), most costly {} "
                        "({:+.2f}%, KLD {:.3g})",
                        best->option.policy, best->delta_ppl_pct, best->mean_kld, worst->option.policy,
                        worst->delta_ppl_pct, worst->mean_kld);
    }
    if (snapkv != nullptr) {
      md += fmt::format("{} SnapKV (compress, then answer) {:+.2f}% (KLD {:.3g})", best != nullptr ? ";" : "",
                        snapkv->delta_ppl_pct, snapkv->mean_kld);
    }
    md += ".\n";
  }
  for (const QualityRow& r : d.quality_policies) {
    // The prompt is the first ctx / 2 tokens: SnapKV compresses it only when it exceeds the budget.
    if (r.option.policy == "snapkv" && r.option.budget >= d.quality_ctx / 2) {
      md += fmt::format("- {}: the {}-token prompt fits the budget, so SnapKV compresses nothing and scores as the "
                        "full cache does (mean KLD {:.3g}).\n",
                        r.option.label, d.quality_ctx / 2, r.mean_kld);
    }
  }
  picture(md, plots, "quality_vs_budget.png", "Delta perplexity against the budget, one line per policy");
}

// The first distance whose accuracy is within one standard error of the control (or below it); "" if none.
std::string first_distance_at_control(const RecallRun& run) {
  for (size_t i = 0; i < run.distances.size(); ++i) {
    if (run.accuracy[i] - run.control[i] <= run.accuracy_stderr[i]) return std::to_string(run.distances[i]);
  }
  return "";
}

void recall_policies_section(std::string& md, const ReportData& d, const std::vector<std::string>& plots) {
  if (d.recall_policies.empty()) return;
  const RecallRun& first = d.recall_policies.front();
  int budget = 0;
  for (const RecallRun& run : d.recall_policies) budget = std::max(budget, run.option.budget);
  md += "\n## Recall: details quantized against details evicted\n\n";
  md += fmt::format(
      "The recall probe above ({} trials, spans of {} tokens), with full caches of quantized codecs (the detail is "
      "kept, at lower precision) beside policies at a budget of {} tokens (the detail is dropped once it leaves "
      "the budget). The second copy's token i needs the first copy's token i + 1, {} + distance − 1 positions "
      "back, so a window of {} loses the first copy for distances above {}. Accuracy minus the control is what "
      "retrieval adds; the control is the model's prior.\n\n",
      d.recall_policies_trials, d.recall_span, budget, d.recall_span, budget, budget - d.recall_span);
  md += "| distance |";
  for (const RecallRun& run : d.recall_policies) md += fmt::format(" {} |", run.option.label);
  md += " control |\n|---:|";
  for (size_t i = 0; i <= d.recall_policies.size(); ++i) md += "---:|";
  md += "\n";
  for (size_t i = 0; i < first.distances.size(); ++i) {
    md += fmt::format("| {} |", first.distances[i]);
    for (const RecallRun& run : d.recall_policies) {
      md += i < run.accuracy.size() ? fmt::format(" {:.3f} ± {:.3f} |", run.accuracy[i], run.accuracy_stderr[i])
                                    : std::string(" – |");
    }
    md += i < first.control.size() ? fmt::format(" {:.3f} |", first.control[i]) : std::string(" – |");
    md += "\n";
  }
  // Each option against its own control (the control runs through the same cache, so a codec's
  // own damage to the prior cancels), averaged over the distances the budget keeps and those past it.
  const int edge = budget - d.recall_span;
  md += fmt::format("\nRetrieval margin, accuracy minus the same cache's control (the control column above is the "
                    "first option's), mean over the distances a window of {} keeps (≤ {}) and those it loses (> {}):"
                    "\n\n| option | margin, distance ≤ {} | margin, distance > {} | first distance within one "
                    "standard error of its control |\n|---|---:|---:|---:|\n",
                    budget, edge, edge, edge, edge);
  for (const RecallRun& run : d.recall_policies) {
    double inside = 0, past = 0;
    int num_inside = 0, num_past = 0;
    for (size_t i = 0; i < run.distances.size(); ++i) {
      const double margin = run.accuracy[i] - run.control[i];
      if (run.distances[i] <= edge) {
        inside += margin;
        ++num_inside;
      } else {
        past += margin;
        ++num_past;
      }
    }
    const std::string at_control = first_distance_at_control(run);
    md += fmt::format("| {} | {} | {} | {} |\n", run.option.label,
                      num_inside > 0 ? fmt::format("{:+.3f}", inside / num_inside) : std::string("–"),
                      num_past > 0 ? fmt::format("{:+.3f}", past / num_past) : std::string("–"),
                      at_control.empty() ? std::string("none") : at_control);
  }
  // How large the signal is: the first option's margins against one point's standard error.
  double first_inside = 0, first_past = 0, stderr_sum = 0;
  int num_inside = 0, num_past = 0;
  for (size_t i = 0; i < first.distances.size(); ++i) {
    const double margin = first.accuracy[i] - first.control[i];
    stderr_sum += first.accuracy_stderr[i];
    if (first.distances[i] <= edge) {
      first_inside += margin;
      ++num_inside;
    } else {
      first_past += margin;
      ++num_past;
    }
  }
  if (num_inside > 0 && num_past > 0 && stderr_sum > 0) {
    const double point_stderr = stderr_sum / static_cast<double>(first.distances.size());
    md += fmt::format("\nThe {} cache's own margin is {:+.3f} up to distance {} and {:+.3f} past it, against a "
                      "standard error of about {:.3f} per point: {}.\n",
                      first.option.label, first_inside / num_inside, edge, first_past / num_past, point_stderr,
                      first_past / num_past < point_stderr
                          ? "past the budget the model's retrieval has mostly faded by itself, so this probe "
                            "separates kept from evicted details only weakly there"
                          : "the model still retrieves past the budget, which the evicting options cannot");
  }
  picture(md, plots, "recall_policies.png", "Recall accuracy against distance, quantized caches and eviction policies");
}

void recall_section(std::string& md, const ReportData& d, const std::vector<std::string>& plots) {
  if (d.recall.empty()) return;
  md += "\n## Recall against distance\n\n";
  const std::string spans = d.recall_text_spans
                                ? "A span of {} consecutive tokens cut from the text at a random offset"
                                : "A span of {} distinct random ordinary tokens";
  md += fmt::format(
      "{}, then `distance` tokens of filler text, then the same span again; top-1 accuracy of the teacher-forced "
      "predictions of the second copy (its first token cannot be inferred), mean ± standard error over {} trials. "
      "The control puts a different span first: what the model predicts without having seen the detail, so "
      "accuracy above the control is retrieval. Chance ≈ {:.4f}. † marks prompts longer than the trained "
      "context.\n\n",
      fmt::format(fmt::runtime(spans), d.recall_span), d.recall_trials, d.recall.front().chance);
  md += "| distance |";
  for (const RecallRun& run : d.recall) md += fmt::format(" {} |", run.option.label);
  md += " control |\n|---:|";
  for (size_t i = 0; i <= d.recall.size(); ++i) md += "---:|";
  md += "\n";
  const RecallRun& first = d.recall.front();
  for (size_t i = 0; i < first.distances.size(); ++i) {
    const bool past = i < first.prompt_tokens.size() && first.prompt_tokens[i] > d.stream_trained_ctx;
    md += fmt::format("| {}{} |", first.distances[i], past ? " †" : "");
    for (const RecallRun& run : d.recall) {
      md += i < run.accuracy.size()
                ? fmt::format(" {:.3f} ± {:.3f} |", run.accuracy[i], run.accuracy_stderr[i])
                : std::string(" – |");
    }
    md += i < first.control.size() ? fmt::format(" {:.3f} |", first.control[i]) : std::string(" – |");
    md += "\n";
  }
  picture(md, plots, "recall.png", "Recall accuracy against distance");
}

void speed_section(std::string& md, const ReportData& d, const std::vector<std::string>& plots) {
  if (d.speed.empty()) return;
  md += "\n## Decode speed against depth\n\n";
  md += fmt::format("`kvlm bench`: {} decode steps after the cache is filled to the depth, mean ± standard deviation "
                    "over {} repetitions, {} threads. GB/s counts the weights and the KV bytes each decode step "
                    "reads. Measured once on a shared machine: compare rows of one report, not across reports.\n\n",
                    d.speed_gen_tokens, d.speed_reps, d.speed_threads);
  md += "| option | depth | decode t/s | GB/s | prefill t/s |\n|---|---:|---:|---:|---:|\n";
  for (const SpeedRun& run : d.speed) {
    for (size_t i = 0; i < run.depths.size(); ++i) {
      md += fmt::format("| {} | {} | {:.1f} ± {:.1f} | {:.2f} | {:.1f} |\n", run.option.label, run.depths[i],
                        run.tg_tokens_per_second[i], run.tg_stddev[i], run.tg_gb_per_second[i],
                        run.pp_tokens_per_second[i]);
    }
  }
  picture(md, plots, "decode_speed.png", "Decode tokens per second against cache depth");
}

}  // namespace

std::string render_report_markdown(const ReportData& d, const std::vector<std::string>& plots,
                                   const std::string& command) {
  std::string md = fmt::format("# kvlm KV-cache report: {}\n\n", d.model.name);
  md += fmt::format("Made {} with `{}` ({} configuration) in {:.1f} s on {}.\n\n", d.date, command, d.config_name,
                    d.seconds, d.machine);
  md += fmt::format("Model: {} architecture, {} layers, {} query heads / {} KV heads, head_dim {}, vocabulary {}, "
                    "context {} (from the GGUF). Text: `{}`, {} tokens.\n",
                    d.model.architecture, d.model.num_layers, d.model.num_heads, d.model.num_kv_heads,
                    d.model.head_dim, d.model.vocab_size, d.model.context_length, d.text_name,
                    grouped(static_cast<uint64_t>(d.text_tokens)));
  memory_section(md, d, plots);
  quality_section(md, d, plots);
  quality_policies_section(md, d, plots);
  stream_section(md, d, plots);
  stream_policies_section(md, d, plots);
  recall_section(md, d, plots);
  recall_policies_section(md, d, plots);
  speed_section(md, d, plots);
  md += fmt::format("\n## Configuration\n\n```json\n{}\n```\n", d.config.dump(2));
  return md;
}

}  // namespace kvlm
