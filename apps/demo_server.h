// The demo's last part: kvlm serve's API in this process on a free loopback port, one chat
// request twice (the second shows the prefix cache's hit) and a /metrics scrape.
#pragma once

namespace kvlm {
class LlamaModel;
class ThreadPool;
}

namespace kvlm::cli {

// Prints what it did; returns false when a request did not answer as expected.
bool demo_server(LlamaModel& model, ThreadPool& pool);

}  // namespace kvlm::cli
