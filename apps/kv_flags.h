// --kv-type / --kv-type-k / --kv-type-v: the KV cache codecs chosen on the command line.
#pragma once

#include <algorithm>
#include <span>
#include <string>
#include <utility>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli_error.h"
#include "kv/kv_storage.h"
#include "kv/kv_type.h"

namespace kvlm::cli {

// K and V may use different codecs; --kv-type sets both, and the specific flags override it.
struct KvTypeFlags {
  std::string both = "f32";
  std::string k;  // empty: same as `both`
  std::string v;
  // KIVI keeps the newest tokens in full precision (KIVI's paper uses 128); rounded up to whole blocks.
  int kivi_residual = kDefaultKiviResidual;
  static constexpr int kDefaultKiviResidual = 128;
  std::string rotate = "auto";  // --kv-rotate: auto (the K codec's default), on, off

  // list_allowed: the command takes a comma-separated list of codecs in --kv-type (kvlm bench).
  void add_to(CLI::App* cmd, bool list_allowed = false) {
    both_option_ = cmd->add_option("--kv-type", both,
                                   "KV cache codec for K and V: " + kv_type_list() +
                                       (list_allowed ? "; a comma-separated list measures each, side by side" : ""))
                       ->capture_default_str();
    k_option_ = cmd->add_option("--kv-type-k", k, "KV cache codec for K (overrides --kv-type)");
    v_option_ = cmd->add_option("--kv-type-v", v, "KV cache codec for V (overrides --kv-type)");
    kivi_residual_option_ = cmd->add_option("--kivi-residual", kivi_residual,
                                            "kivi4/kivi2: newest tokens kept in full precision, rounded up to "
                                            "whole blocks")
                                ->capture_default_str();
    cmd->add_option("--kv-rotate", rotate,
                    "store keys Hadamard-rotated (queries rotated alike, attention unchanged) so that per-token "
                    "scales do not spend their range on outlier channels: auto (int8 and int4 keys), on, off")
        ->capture_default_str();
  }

  KvType k_type() const { return parse(k.empty() ? both : k, k.empty() ? "--kv-type" : "--kv-type-k"); }
  KvType v_type() const { return parse(v.empty() ? both : v, v.empty() ? "--kv-type" : "--kv-type-v"); }
  // The storage options of a run of k_type() and v_type(); CliError for a bad value, or for a flag
  // the codecs would ignore (see storage_options_for).
  KvStorageOptions storage_options() const {
    const std::pair<KvType, KvType> codec[] = {{k_type(), v_type()}};
    return storage_options_for(codec);
  }

  // The same for a command that runs each of `codecs` (K, V) with these options (kvlm bench's
  // list). A flag the user gave that no codec reads is an error, not a quiet default:
  // --kivi-residual without a KIVI K or V, and --kv-type when --kv-type-k and --kv-type-v both
  // override it. --kv-rotate is read by every codec (the storage rotates whatever the K codec).
  KvStorageOptions storage_options_for(std::span<const std::pair<KvType, KvType>> codecs) const {
    if (given(both_option_) && given(k_option_) && given(v_option_)) {
      throw CliError("--kv-type does nothing when --kv-type-k and --kv-type-v are both given: drop --kv-type, or "
                     "one of the other two");
    }
    const bool any_kivi = std::any_of(codecs.begin(), codecs.end(),
                                      [](const auto& c) { return is_kivi(c.first) || is_kivi(c.second); });
    if (given(kivi_residual_option_) && !any_kivi) {
      throw CliError(fmt::format("--kivi-residual does nothing without a KIVI codec (K/V here: {}): drop "
                                 "--kivi-residual, or give K or V kivi4 or kivi2 with --kv-type, --kv-type-k or "
                                 "--kv-type-v",
                                 codec_names(codecs)));
    }
    constexpr int kMaxResidual = 1 << 20;
    if (kivi_residual < 0 || kivi_residual > kMaxResidual) {
      throw CliError(fmt::format("--kivi-residual {} must be in [0, {}]", kivi_residual, kMaxResidual));
    }
    KvStorageOptions options{.kivi_residual_tokens = kivi_residual};
    if (rotate == "on") {
      options.rotate_keys = true;
    } else if (rotate == "off") {
      options.rotate_keys = false;
    } else if (rotate != "auto") {
      throw CliError(fmt::format("--kv-rotate '{}' is not one of: auto, on, off", rotate));
    }
    return options;
  }

  // Whether the cache will store keys Hadamard-rotated (--kv-rotate, else the K codec's default).
  bool keys_rotated() const { return storage_options().rotate_keys.value_or(rotates_keys_by_default(k_type())); }

  // "f16" when K and V agree, else "int8/int4" (K/V), for tables and reports.
  std::string label() const { return pair_label(k_type(), v_type()); }

 private:
  static bool given(const CLI::Option* option) { return option != nullptr && option->count() > 0; }

  static std::string pair_label(KvType k_type, KvType v_type) {
    const std::string_view kn = kv_type_name(k_type), vn = kv_type_name(v_type);
    return kn == vn ? std::string(kn) : fmt::format("{}/{}", kn, vn);
  }
  // "f16, int8/int4": the codecs as label() names them, for errors.
  static std::string codec_names(std::span<const std::pair<KvType, KvType>> codecs) {
    std::string names;
    for (const auto& [kt, vt] : codecs) names += (names.empty() ? "" : ", ") + pair_label(kt, vt);
    return names;
  }

  // Set by add_to, to tell a flag the user gave from a default.
  const CLI::Option* both_option_ = nullptr;
  const CLI::Option* k_option_ = nullptr;
  const CLI::Option* v_option_ = nullptr;
  const CLI::Option* kivi_residual_option_ = nullptr;

  static KvType parse(const std::string& name, const char* flag) {
    auto type = parse_kv_type(name);
    if (!type) throw CliError(fmt::format("{} '{}' is not one of: {}", flag, name, kv_type_list()));
    return *type;
  }
};

}  // namespace kvlm::cli
