#include "report/report_markdown.h"

#include <algorithm>
#include <cmath>

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

void memory_section(std::string& md, const ReportData& d, const std::vector<std::string>& plots) {
  if (d.memory.empty()) return;
  md += "\n## Memory per token\n\n";
  md += fmt::format("K + V bytes one token takes over all {} layers (scales and other metadata included). The planner's "
                    "figure is `kvlm plan`'s formula; the live figure comes from the KV pool built for that codec.\n\n",
                    d.model.num_layers);
  md += "KIVI options also hold their newest tokens (the residual window, rounded up to whole blocks, plus the "
        "block being filled) in f32 staging: a fixed cost per sequence, listed separately.\n\n";
  md += "| option | K / V codec | bytes/token (planner) | bytes/token (live pool) | vs f16 | f32 staging per sequence |\n"
        "|---|---|---:|---:|---:|---:|\n";
  for (const MemoryRow& r : d.memory) {
    md += fmt::format("| {} | {} | {} | {} | {:.3f}× | {} |\n", r.option.label, kv_label(r.option),
                      grouped(r.planned_bytes_per_token), grouped(r.live_bytes_per_token), r.ratio_to_f16,
                      r.staging_bytes_per_sequence > 0 ? grouped(r.staging_bytes_per_sequence) : std::string("–"));
  }
  picture(md, plots, "memory_per_token.png", "KV bytes per token for each option");
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
  stream_section(md, d, plots);
  recall_section(md, d, plots);
  speed_section(md, d, plots);
  md += fmt::format("\n## Configuration\n\n```json\n{}\n```\n", d.config.dump(2));
  return md;
}

}  // namespace kvlm
