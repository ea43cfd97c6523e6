// Tasks and tokenizer: answers, determinism, disjoint splits, round trips, bad input.
#include <gtest/gtest.h>

#include <set>

#include "common/check.h"
#include "tasks/tasks.h"
#include "tasks/tokenizer.h"

namespace moerl::tasks {
namespace {

TEST(Tasks, AnswersFromPromptText) {
  EXPECT_EQ(answer_for("add", "47+815="), "862");
  EXPECT_EQ(answer_for("add", "0+0="), "0");
  EXPECT_EQ(answer_for("sort", "sort:3912="), "1239");
  EXPECT_EQ(answer_for("reverse", "rev:abcd="), "dcba");
  EXPECT_THROW(answer_for("add", "47-815="), moerl::Error);
  EXPECT_THROW(answer_for("sort", "sort:39a="), moerl::Error);
  EXPECT_THROW(answer_for("nope", "1+1="), moerl::Error);
}

TEST(Tasks, RewardIsExactMatchAfterStop) {
  EXPECT_EQ(reward("add", "1+2=", "3", true), 1.0f);
  EXPECT_EQ(reward("add", "1+2=", "3", false), 0.0f);
  EXPECT_EQ(reward("add", "1+2=", "03", true), 0.0f);
}

TEST(Tasks, PromptsAreDeterministicAndSplitsDisjoint) {
  for (const std::string& task : task_names()) {
    std::set<std::string> train, eval;
    for (int i = 0; i < 300; i++) {
      Prompt p = make_prompt(task, Split::Train, 5, i);
      EXPECT_EQ(p.text, make_prompt(task, Split::Train, 5, i).text);
      EXPECT_EQ(p.answer, answer_for(task, p.text));
      EXPECT_NE(fnv1a32(p.text) % 10, 0u);
      train.insert(p.text);
      Prompt e = make_prompt(task, Split::Eval, 5, i);
      EXPECT_EQ(fnv1a32(e.text) % 10, 0u);
      eval.insert(e.text);
    }
    for (const std::string& e : eval) EXPECT_EQ(train.count(e), 0u) << task << " " << e;
    EXPECT_GT(train.size(), 100u) << task;
  }
  EXPECT_NE(make_prompt("add", Split::Train, 5, 0).text, make_prompt("add", Split::Train, 6, 0).text);
}

TEST(Tokenizer, RoundTripAndErrors) {
  std::string s = "sort:0123=rev:xyz, +";
  std::vector<int32_t> ids = encode(s);
  EXPECT_EQ(decode(ids), s);
  for (int32_t id : ids) EXPECT_LT(id, kVocabSize);
  ids.insert(ids.begin() + 3, kEos);
  EXPECT_EQ(decode(ids), "sor");
  EXPECT_THROW(encode("ABC"), moerl::Error);
}

}  // namespace
}  // namespace moerl::tasks
