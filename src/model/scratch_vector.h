// Scratch buffers that keep their largest size: a forward grows them to the step's need and never
// shrinks them, so steady decode allocates nothing.
#pragma once

#include <cstdint>
#include <vector>

#include "core/check.h"

namespace kvlm {

template <typename T>
void grow_scratch(std::vector<T>& v, int64_t size) {
  KVLM_DCHECK(size >= 0, "scratch size {}", size);
  if (v.size() < static_cast<size_t>(size)) v.resize(static_cast<size_t>(size));
}

}  // namespace kvlm
