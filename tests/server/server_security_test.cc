// Security defaults: loopback bind, an API key that never reaches a log or a reply, no route that
// reads a file a client names, and cache_salt keeping tenants' cached prompts apart.
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "server_test_util.h"
#include "support/listening_sockets.h"

namespace kvlm::testing {
namespace {

using nlohmann::json;

// Everything spdlog's default logger writes while it lives, at every level.
class CapturedLog {
 public:
  CapturedLog()
      : previous_(spdlog::default_logger()),
        sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(stream_)) {
    auto logger = std::make_shared<spdlog::logger>("captured", sink_);
    logger->set_level(spdlog::level::trace);
    spdlog::set_default_logger(logger);
  }
  ~CapturedLog() { spdlog::set_default_logger(previous_); }
  // Read once the server that logs has stopped.
  std::string text() {
    sink_->flush();
    return stream_.str();
  }

 private:
  std::shared_ptr<spdlog::logger> previous_;
  std::ostringstream stream_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

TEST(ServerSecurity, BindsLoopbackUnlessToldOtherwise) {
  KVLM_REQUIRE_STORIES();
  EXPECT_EQ(server::ServerOptions{}.host, "127.0.0.1");
  TestServer ts;  // the test options leave the host at its default
  EXPECT_EQ(listening_addresses(ts.port()), std::vector<std::string>{"127.0.0.1"});
}

TEST(ServerSecurity, TheApiKeyNeverAppearsInTheLogMetricsOrReplies) {
  KVLM_REQUIRE_STORIES();
  const std::string key = "sk-never-log-me-7f3a";
  const std::string wrong = "sk-wrong-guess-91c2";
  CapturedLog log;
  std::string replies;
  {
    TestServerOptions options;
    options.server.api_key = key;
    options.server.log_prompts = true;  // the most the log ever says
    TestServer ts(options);
    auto c = ts.client();
    const std::string body = R"({"prompt": "Once upon a time", "max_tokens": 3})";
    for (const httplib::Headers& headers : std::vector<httplib::Headers>{
             {}, {{"Authorization", "Bearer " + wrong}}, {{"Authorization", wrong}}, {{"Authorization", "Bearer " + key}}}) {
      auto res = c.Post("/v1/completions", headers, body, "application/json");
      ASSERT_TRUE(res);
      replies += res->body;
    }
    const httplib::Headers auth = {{"Authorization", "Bearer " + key}};
    for (const char* path : {"/metrics", "/v1/models", "/health", "/no/such/route"}) {
      auto res = c.Get(path, auth);
      ASSERT_TRUE(res);
      replies += res->body;
    }
    auto bad = c.Post("/v1/completions", auth, R"({"prompt": 5})", "application/json");  // an error reply
    ASSERT_TRUE(bad);
    EXPECT_EQ(bad->status, 400);
    replies += bad->body;
  }
  const std::string text = log.text();
  EXPECT_NE(text.find("POST /v1/completions 401"), std::string::npos) << "the log was captured:\n" << text;
  EXPECT_NE(text.find("POST /v1/completions 200"), std::string::npos) << text;
  EXPECT_EQ(text.find(key), std::string::npos) << text;
  EXPECT_EQ(text.find(wrong), std::string::npos) << text;
  EXPECT_EQ(replies.find(key), std::string::npos) << replies;
  EXPECT_EQ(replies.find(wrong), std::string::npos) << replies;
}

// No route serves or reads a file: paths in the URL or in any field are text, never opened.
TEST(ServerSecurity, NoRouteReadsAFileAClientNames) {
  KVLM_REQUIRE_STORIES();
  const std::filesystem::path secret = scratch_dir("server_security") / "secret.txt";
  const std::string marker = "file-contents-3b9e5d";
  std::ofstream(secret) << marker;
  TestServer ts;
  auto c = ts.client();
  std::string replies;
  for (const std::string& path : {"/" + secret.string(), "/.." + secret.string(), "/v1/../../../.." + secret.string(),
                                  "/static" + secret.string(), "/v1/models/.." + secret.string(), std::string("/etc/passwd")}) {
    auto res = c.Get(path);
    ASSERT_TRUE(res) << path;
    EXPECT_NE(res->status, 200) << path;
    replies += res->body;
  }
  const std::string p = secret.string();
  json path_fields = {{"prompt", "a"}, {"max_tokens", 2}, {"chat_template", p}, {"grammar_file", p}, {"file", p}};
  path_fields["kv"] = {{"path", p}};
  json image = json::parse(R"({"max_tokens": 2, "messages": [{"role": "user", "content": [
                                {"type": "image_url", "image_url": {"url": "URL"}}]}]})");
  image["messages"][0]["content"][0]["image_url"]["url"] = "file://" + p;
  json as_prompt = {{"prompt", p}, {"max_tokens", 2}, {"model", p}, {"content", p}};
  for (const json& body : {as_prompt, path_fields, image}) {
    for (const char* route : {"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"}) {
      auto res = c.Post(route, body.dump(), "application/json");
      ASSERT_TRUE(res) << route;
      replies += res->body;
    }
  }
  EXPECT_EQ(replies.find(marker), std::string::npos) << replies;
  EXPECT_EQ(replies.find("root:"), std::string::npos) << replies;
}

// The audit behind the test above: the server module has no call that opens or maps a file, and
// mounts no directory (httplib's set_mount_point / set_base_dir serve files from disk).
TEST(ServerSecurity, TheServerModuleHasNoFileAccess) {
  const std::regex file_access(
      R"(\b(fopen|ifstream|ofstream|fstream|open|openat|mmap|set_mount_point|set_base_dir|set_file_extension_and_mimetype_mapping)\s*\(|std::filesystem|<fstream>)");
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(KVLM_SOURCE_DIR) / "src/server")) {
    std::ifstream in(entry.path());
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      EXPECT_FALSE(std::regex_search(line, file_access)) << entry.path().filename().string() << ":" << n << ": " << line;
    }
    ++files;
  }
  EXPECT_GT(files, 5);
}

int cached_tokens(httplib::Client& c, const std::string& route, json body) {
  body["max_tokens"] = 2;
  body["temperature"] = 0;
  auto res = c.Post(route, body.dump(), "application/json");
  EXPECT_TRUE(res);
  if (!res) return -1;
  EXPECT_EQ(res->status, 200) << res->body;
  return json::parse(res->body)["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
}

// Timing-free: what the server reports as cached decides. A salt sees only what was cached under
// the same salt; no salt is a tenant of its own.
TEST(ServerSecurity, CacheSaltKeepsEachTenantsCachedPromptsApart) {
  KVLM_REQUIRE_STORIES();
  TestServer ts;
  auto c = ts.client();
  std::string prompt;
  for (int i = 0; i < 5; ++i) prompt += "The little cat sat on the warm mat by the door. ";
  const json plain = {{"prompt", prompt}};
  json salt_a = plain;
  salt_a["cache_salt"] = "tenant-a";
  json salt_a_in_kv = plain;
  salt_a_in_kv["kv"] = {{"cache_salt", "tenant-a"}};
  json salt_b = plain;
  salt_b["cache_salt"] = "tenant-b";

  EXPECT_EQ(cached_tokens(c, "/v1/completions", salt_a), 0);
  EXPECT_EQ(cached_tokens(c, "/v1/completions", plain), 0) << "no salt never sees salt A's blocks";
  EXPECT_EQ(cached_tokens(c, "/v1/completions", salt_b), 0) << "salt B never sees salt A's or unsalted blocks";
  const int hit_a = cached_tokens(c, "/v1/completions", salt_a);
  EXPECT_GE(hit_a, 16) << "the same salt gets its cache hit";
  EXPECT_EQ(cached_tokens(c, "/v1/completions", salt_a_in_kv), hit_a) << "kv.cache_salt is the same salt";
  EXPECT_EQ(cached_tokens(c, "/v1/completions", salt_b), hit_a);
  EXPECT_EQ(cached_tokens(c, "/v1/completions", plain), hit_a);
  // A salt that only shares a prefix with another is another salt.
  json salt_a_longer = plain;
  salt_a_longer["cache_salt"] = "tenant-a2";
  EXPECT_EQ(cached_tokens(c, "/v1/completions", salt_a_longer), 0);

  // Chat: the rendered prompt is cached per salt the same way.
  const json messages = {{{"role", "user"}, {"content", prompt}}};
  EXPECT_EQ(cached_tokens(c, "/v1/chat/completions", {{"messages", messages}, {"cache_salt", "tenant-c"}}), 0);
  EXPECT_EQ(cached_tokens(c, "/v1/chat/completions", {{"messages", messages}, {"cache_salt", "tenant-d"}}), 0);
  EXPECT_GE(cached_tokens(c, "/v1/chat/completions", {{"messages", messages}, {"cache_salt", "tenant-c"}}), 16);
  ASSERT_TRUE(ts.wait_idle());
  EXPECT_EQ(ts.engine().leaked_blocks(), 0);
}

}  // namespace
}  // namespace kvlm::testing
