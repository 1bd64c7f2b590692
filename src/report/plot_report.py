#!/usr/bin/env python3
"""Draws the PNG plots of a kvlm report from its report.json (written by `kvlm report`).

Usage: plot_report.py REPORT_JSON OUT_DIR
Prints one line per PNG written. Sections missing from the JSON are skipped.
The kvlm binary carries this script and writes it next to the report before running it.
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from cycler import cycler  # noqa: E402

# The matrix has more options than the default 10-colour cycle: 20 distinct colours.
plt.rcParams["axes.prop_cycle"] = cycler(color=plt.get_cmap("tab20").colors)


def save(fig, out_dir, name):
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(path)


def plot_memory(report, out_dir):
    rows = report.get("memory", [])
    if not rows:
        return
    labels = [r["option"] for r in rows]
    kib = [r["bytes_per_token"] / 1024.0 for r in rows]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    bars = ax.bar(labels, kib, color="#4477aa")
    for bar, r in zip(bars, rows):
        ax.annotate(f'{r["ratio_to_f16"]:.2f}x', (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("KV bytes per token (KiB)")
    ax.set_title(f'KV memory per token ({report["model"]["name"]}); label = ratio to f16')
    ax.tick_params(axis="x", rotation=30)
    save(fig, out_dir, "memory_per_token.png")


def plot_quality(report, out_dir):
    rows = [r for r in report.get("quality", []) if not r.get("baseline")]
    if not rows:
        return
    labels = [r["option"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    ax1.bar(labels, [r["delta_ppl_pct"] for r in rows], color="#cc6677")
    ax1.set_ylabel("ΔPPL vs f32 cache (%, symlog)")
    ax1.axhline(0, color="black", linewidth=0.6)
    ax1.set_yscale("symlog", linthresh=0.1)  # ±0.1% linear, log beyond: small and large costs both visible
    ax2.bar(labels, [max(r["mean_kld"], 1e-12) for r in rows], color="#117733")
    ax2.set_yscale("log")
    ax2.set_ylabel("mean KLD vs f32 cache (nats)")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle("Quality cost of each KV option")
    save(fig, out_dir, "quality.png")


def plot_stream(report, out_dir):
    runs = report.get("stream", [])
    if not runs:
        return
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for run in runs:
        ends = [s["end"] for s in run["segments"]]
        ax.plot(ends, [s["ppl"] for s in run["segments"]], marker=".", label=run["option"])
    trained = report["stream_trained_ctx"] if "stream_trained_ctx" in report else None
    if trained:
        ax.axvline(trained, color="gray", linestyle="--", linewidth=0.8)
        ax.annotate("trained context", (trained, ax.get_ylim()[1]), fontsize=8, ha="left", va="top")
    ax.set_xlabel("position in the stream (tokens)")
    ax.set_ylabel("perplexity of the segment")
    ax.set_yscale("log")
    ax.set_title("Stream perplexity over length")
    ax.legend(fontsize=8)
    save(fig, out_dir, "stream_ppl.png")


def plot_recall(report, out_dir):
    runs = report.get("recall", [])
    if not runs:
        return
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for run in runs:
        ax.errorbar(run["distances"], run["accuracy"], yerr=run.get("accuracy_stderr"), marker="o", capsize=2,
                    label=run["option"])
    first = runs[0]
    if "control" in first:
        ax.plot(first["distances"], first["control"], linestyle=":", color="gray", label="control (a different first span)")
    ax.set_xlabel("distance between the two copies (tokens)")
    ax.set_ylabel("top-1 accuracy on the second copy")
    ax.set_ylim(0, 1.02)
    ax.set_title("Recall against distance")
    ax.legend(fontsize=8)
    save(fig, out_dir, "recall.png")


def policy_axes(figsize):
    """Axes for the eviction plots: few lines, so the 10 strong colours (tab20's pairs look alike)."""
    fig, ax = plt.subplots(figsize=figsize)
    ax.set_prop_cycle(cycler(color=plt.get_cmap("tab10").colors))
    return fig, ax


def legend_outside(ax):
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))


def plot_stream_policies(report, out_dir):
    runs = report.get("stream_policies", [])
    if not runs:
        return
    fig, ax = policy_axes((9, 3.8))
    for run in runs:
        ends = [s["end"] for s in run["segments"]]
        style = {"color": "black", "linewidth": 1.6} if run.get("policy", "none") == "none" else {}
        ax.plot(ends, [s["ppl"] for s in run["segments"]], marker=".", label=run["option"], **style)
    trained = report.get("stream_trained_ctx")
    if trained:
        ax.axvline(trained, color="gray", linestyle="--", linewidth=0.8)
        ax.annotate("trained context", (trained, ax.get_ylim()[1]), fontsize=8, ha="left", va="top")
    ax.set_xlabel("position in the stream (tokens)")
    ax.set_ylabel("perplexity of the segment")
    ax.set_yscale("log")
    ax.set_title(f'Stream perplexity under token eviction (budget {report.get("evict_stream_budget", "?")})')
    legend_outside(ax)
    save(fig, out_dir, "stream_ppl_policies.png")


def plot_quality_vs_budget(report, out_dir):
    rows = report.get("quality_policies", [])
    ctx = report.get("quality_ctx", 0)
    if not rows or not ctx:
        return
    fig, ax = policy_axes((8.5, 3.8))
    # One line per policy with the f32 codec; composed rows (a quantized codec too) as single markers.
    lines = {}
    for r in rows:
        key = r["policy"] if r["kv_type_k"] == "f32" and r["kv_type_v"] == "f32" else r["option"]
        lines.setdefault(key, []).append((r["budget"] / ctx, r["delta_ppl_pct"]))
    for key, points in lines.items():
        points.sort()
        xs = [100 * x for x, _ in points]
        ys = [y for _, y in points]
        ax.plot(xs, ys, marker="o" if len(points) > 1 else "D", linestyle="-" if len(points) > 1 else "none",
                label=key)
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_xlabel(f"budget (% of the {ctx}-token window)")
    ax.set_ylabel("ΔPPL vs f32 full cache (%, symlog)")
    ax.set_title("Quality against the eviction budget")
    legend_outside(ax)
    save(fig, out_dir, "quality_vs_budget.png")


def plot_recall_policies(report, out_dir):
    runs = report.get("recall_policies", [])
    if not runs:
        return
    fig, ax = policy_axes((8.5, 3.8))
    for run in runs:
        evicts = run.get("policy", "none") != "none"
        ax.errorbar(run["distances"], run["accuracy"], yerr=run.get("accuracy_stderr"), marker="s" if evicts else "o",
                    linestyle="--" if evicts else "-", capsize=2, label=run["option"])
    first = runs[0]
    ax.plot(first["distances"], first["control"], linestyle=":", color="gray", linewidth=2,
            label="control (a different first span)")
    budgets = sorted({run["budget"] for run in runs if run.get("budget")})
    span = report.get("recall_span", 0)
    for budget in budgets:
        ax.axvline(budget - span, color="gray", linestyle="--", linewidth=0.8)
        ax.annotate(f"budget {budget} − span", (budget - span, ax.get_ylim()[0]), fontsize=8, ha="left", va="bottom")
    ax.set_xlabel("distance between the two copies (tokens)")
    ax.set_ylabel("top-1 accuracy on the second copy")
    ax.set_title("Recall: details quantized against details evicted")
    legend_outside(ax)
    save(fig, out_dir, "recall_policies.png")


def plot_speed(report, out_dir):
    runs = report.get("speed", [])
    if not runs:
        return
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for run in runs:
        ax.errorbar(run["depths"], run["tg_tokens_per_second"], yerr=run.get("tg_stddev"), marker="o", capsize=2,
                    label=run["option"])
    ax.set_xlabel("cache depth (tokens)")
    ax.set_ylabel("decode tokens/s")
    ax.set_title(f'Decode speed against depth ({report.get("speed_threads", "?")} threads)')
    ax.legend(fontsize=8)
    save(fig, out_dir, "decode_speed.png")


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot_report.py REPORT_JSON OUT_DIR")
    with open(sys.argv[1], encoding="utf-8") as f:
        report = json.load(f)
    out_dir = sys.argv[2]
    for plot in (plot_memory, plot_quality, plot_quality_vs_budget, plot_stream, plot_stream_policies, plot_recall,
                 plot_recall_policies, plot_speed):
        plot(report, out_dir)


if __name__ == "__main__":
    main()
