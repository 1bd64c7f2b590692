// `kvlm convert llama2c`: llama2.c checkpoints and tokenizers to GGUF.
#include <cstdio>
#include <memory>
#include <string>

#include "cli_error.h"
#include "commands.h"
#include "model/llama2c_converter.h"

namespace kvlm::cli {

CLI::App* add_convert_command(CLI::App& app) {
  CLI::App* convert = app.add_subcommand("convert", "Convert other model formats to GGUF");
  convert->require_subcommand(1);
  auto options = std::make_shared<Llama2cConvertOptions>();
  auto type = std::make_shared<std::string>("f32");
  CLI::App* l2c = convert->add_subcommand("llama2c", "llama2.c legacy checkpoint + tokenizer.bin to GGUF");
  l2c->add_option("--checkpoint", options->checkpoint_path, "llama2.c model .bin")->required();
  l2c->add_option("--tokenizer", options->tokenizer_path, "llama2.c tokenizer .bin")->required();
  l2c->add_option("--out,-o", options->out_path, "output GGUF path")->required();
  l2c->add_option("--name", options->name, "general.name");
  l2c->add_option("--type", *type, fmt::format("weight type: {}", supported_ggml_type_names()))->capture_default_str();
  l2c->callback([options, type] {
    auto t = parse_ggml_type(*type);
    if (!t || !ggml_type_traits(*t).supported) {
      throw CliError(fmt::format("--type '{}' is not one of: {}", *type, supported_ggml_type_names()));
    }
    options->weight_type = *t;
    throw_if_error(convert_llama2c(*options));
    std::printf("wrote %s\n", options->out_path.c_str());
  });
  return convert;
}

}  // namespace kvlm::cli
