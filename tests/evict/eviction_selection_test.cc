// Which slots H2O evicts and SnapKV keeps, on hand-made attention patterns with exact answers.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "evict/eviction_options.h"
#include "evict/eviction_selection.h"

namespace kvlm {
namespace {

using ::testing::ElementsAre;

TEST(H2oVictims, LowestAccumulatedAttentionOutsideTheRecentWindow) {
  // Slots 5 and 6 are recent (protected) even though slot 5 has the lowest score of all.
  const std::vector<float> scores = {5, 1, 3, 1, 9, 0.5f, 2};
  EXPECT_THAT(h2o_victims(scores, /*recent=*/2, /*num_evict=*/2), ElementsAre(1, 3));
  EXPECT_THAT(h2o_victims(scores, 2, 3), ElementsAre(1, 2, 3));
  EXPECT_THAT(h2o_victims(scores, 0, 1), ElementsAre(5));
}

TEST(H2oVictims, TiesGoToTheOlderSlotAndTheCountIsCapped) {
  const std::vector<float> flat = {1, 1, 1, 1};
  EXPECT_THAT(h2o_victims(flat, 0, 2), ElementsAre(0, 1));
  EXPECT_THAT(h2o_victims(flat, 3, 5), ElementsAre(0));  // only one slot is unprotected
  EXPECT_TRUE(h2o_victims(flat, 4, 1).empty());
}

TEST(SnapKv, MaxPoolingSpreadsAPeakToItsNeighbours) {
  const std::vector<float> votes = {0, 0, 5, 0, 0, 0, 1};
  EXPECT_THAT(max_pool_votes(votes, 3), ElementsAre(0, 5, 5, 5, 0, 1, 1));
  EXPECT_THAT(max_pool_votes(votes, 1), ElementsAre(0, 0, 5, 0, 0, 0, 1));
  EXPECT_THAT(max_pool_votes(votes, 5), ElementsAre(5, 5, 5, 5, 5, 1, 1));
}

TEST(SnapKv, KeepsTheObservationWindowAndThePhraseAroundThePeak) {
  // 10 slots, the last 2 are the observation window; slot 3 is what the window attends to.
  std::vector<float> votes(10, 0.01f);
  votes[3] = 1.0f;
  votes[8] = 7.0f;  // inside the window: always kept, never competes
  EXPECT_THAT(snapkv_kept(votes, /*window=*/2, /*kernel=*/3, /*budget=*/5), ElementsAre(2, 3, 4, 8, 9));
  // Without pooling the peak alone wins, then the ties go to the oldest slots.
  EXPECT_THAT(snapkv_kept(votes, 2, 1, 5), ElementsAre(0, 1, 3, 8, 9));
}

TEST(SnapKv, KeepsEverythingWithinTheBudget) {
  const std::vector<float> votes = {3, 2, 1};
  EXPECT_THAT(snapkv_kept(votes, 1, 3, 3), ElementsAre(0, 1, 2));
}

TEST(EvictionOptions, ParsesNamesAndRejectsBadBudgetsNamingTheFlag) {
  EXPECT_EQ(parse_eviction_policy("streaming").value(), EvictionPolicy::kStreaming);
  EXPECT_NE(parse_eviction_policy("lru").status().message().find("window, streaming"), std::string::npos);
  EvictionOptions o;
  o.policy = EvictionPolicy::kStreaming;
  o.budget = 0;
  EXPECT_NE(validate_eviction_options(o).message().find("--budget"), std::string::npos);
  o.budget = 4;
  o.sinks = 4;
  EXPECT_NE(validate_eviction_options(o).message().find("--sinks"), std::string::npos);
  o.sinks = 2;
  o.evicting_step = 3;  // more than budget - sinks
  EXPECT_NE(validate_eviction_options(o).message().find("--evict-step"), std::string::npos);
  o.evicting_step = 2;
  EXPECT_TRUE(validate_eviction_options(o).ok());
  o.policy = EvictionPolicy::kSnapKv;
  o.snapkv_window = 4;
  EXPECT_NE(validate_eviction_options(o).message().find("--snapkv-window"), std::string::npos);
  o.snapkv_window = 2;
  o.snapkv_kernel = 4;
  EXPECT_NE(validate_eviction_options(o).message().find("--snapkv-kernel"), std::string::npos);
  o.policy = EvictionPolicy::kH2o;
  o.recent = 4;
  EXPECT_NE(validate_eviction_options(o).message().find("--h2o-recent"), std::string::npos);
  o.recent = 0;
  EXPECT_EQ(o.h2o_recent(), 2);
  EXPECT_TRUE(validate_eviction_options(o).ok());
  o.evicting_step = 3;  // the victims of a step must fit among the 2 tokens older than the recent 2
  EXPECT_NE(validate_eviction_options(o).message().find("--evict-step"), std::string::npos);
}

}  // namespace
}  // namespace kvlm
