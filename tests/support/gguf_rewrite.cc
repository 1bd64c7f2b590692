#include "support/gguf_rewrite.h"

#include <vector>

#include <gtest/gtest.h>

#include "gguf/gguf_file.h"

namespace kvlm::testing {

std::string rewrite_gguf_metadata(const std::string& src, const std::string& dst,
                                  const std::function<void(GgufWriter&)>& edit, std::string_view skip_key) {
  auto file = GgufFile::open(src);
  EXPECT_TRUE(file.ok()) << file.status().message();
  if (!file.ok()) return dst;
  GgufWriter w;
  for (const GgufKeyValue& kv : (*file)->metadata()) {
    if (skip_key.empty() || kv.key != skip_key) w.set(kv.key, kv.value);
  }
  edit(w);
  for (const GgufTensorInfo& t : (*file)->tensors()) {
    w.add_tensor(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.num_bytes));
  }
  const Status s = w.write(dst);
  EXPECT_TRUE(s.ok()) << s.message();
  return dst;
}

}  // namespace kvlm::testing
