// --kv-type / --kv-type-k / --kv-type-v: the KV cache codecs chosen on the command line.
#pragma once

#include <string>

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
    cmd->add_option("--kv-type", both,
                    "KV cache codec for K and V: " + kv_type_list() +
                        (list_allowed ? "; a comma-separated list measures each, side by side" : ""))
        ->capture_default_str();
    cmd->add_option("--kv-type-k", k, "KV cache codec for K (overrides --kv-type)");
    cmd->add_option("--kv-type-v", v, "KV cache codec for V (overrides --kv-type)");
    cmd->add_option("--kivi-residual", kivi_residual,
                    "kivi4/kivi2: newest tokens kept in full precision, rounded up to whole blocks")
        ->capture_default_str();
    cmd->add_option("--kv-rotate", rotate,
                    "store keys Hadamard-rotated (queries rotated alike, attention unchanged) so that per-token "
                    "scales do not spend their range on outlier channels: auto (int8 and int4 keys), on, off")
        ->capture_default_str();
  }

  KvType k_type() const { return parse(k.empty() ? both : k, k.empty() ? "--kv-type" : "--kv-type-k"); }
  KvType v_type() const { return parse(v.empty() ? both : v, v.empty() ? "--kv-type" : "--kv-type-v"); }
  KvStorageOptions storage_options() const {
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
  std::string label() const {
    const std::string_view kn = kv_type_name(k_type()), vn = kv_type_name(v_type());
    return kn == vn ? std::string(kn) : fmt::format("{}/{}", kn, vn);
  }

 private:
  static KvType parse(const std::string& name, const char* flag) {
    auto type = parse_kv_type(name);
    if (!type) throw CliError(fmt::format("{} '{}' is not one of: {}", flag, name, kv_type_list()));
    return *type;
  }
};

}  // namespace kvlm::cli
