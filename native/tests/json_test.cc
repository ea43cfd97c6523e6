// JSON input: every malformed input is BadInput (exit 2, not retried) naming the input, and
// typed access names the field. Regressions of the hand-written parser this replaced: "1-2"
// read as a number, a bad \u escape threw a generic (retryable) error.
#include <gtest/gtest.h>

#include <string>

#include "common/check.h"
#include "bad_input.h"
#include "io/json.h"

namespace moerl::io {
namespace {

using moerl::testing::bad_input;

TEST(Json, ExpressionIsNotANumber) {
  std::string err = bad_input([] { parse_json("1-2", "rewards.jsonl line 4"); });
  EXPECT_NE(err.find("rewards.jsonl line 4: invalid JSON"), std::string::npos) << err;
  err = bad_input([] { parse_json("{\"reward\":1-2}", "r line 1"); });
  EXPECT_NE(err.find("r line 1"), std::string::npos) << err;
}

TEST(Json, BadUnicodeEscapeIsBadInput) {
  for (const char* text : {"\"\\u12G4\"", "\"\\u12\"", "\"\\ud800\""}) {
    std::string err = bad_input([&] { parse_json(text, "prompts.jsonl line 2"); });
    EXPECT_NE(err.find("prompts.jsonl line 2: invalid JSON"), std::string::npos) << text << ": " << err;
  }
  EXPECT_EQ(as_string(parse_json("\"\\u00e9\\ud83d\\ude00\"", "ok"), "ok"), "\xc3\xa9\xf0\x9f\x98\x80");
}

TEST(Json, TrailingTextAndTruncationAreBadInput) {
  for (const char* text : {"{\"a\":1} x", "{\"a\":", "", "[1,]", "nul"})
    EXPECT_NE(bad_input([&] { parse_json(text, "f line 9"); }).find("f line 9"), std::string::npos)
        << text;
}

TEST(Json, DeepNestingDoesNotCrash) {
  std::string deep(100000, '[');
  deep += std::string(100000, ']');
  EXPECT_TRUE(parse_json(deep, "deep").is_array());
}

TEST(Json, TypedFieldsNameTheField) {
  Json j = parse_json("{\"id\":3.5,\"big\":18446744073709551615,\"n\":4.0,\"s\":1}", "rec");
  EXPECT_NE(bad_input([&] { integer_field(j, "id", "rec"); }).find("rec field \"id\""), std::string::npos);
  EXPECT_NE(bad_input([&] { integer_field(j, "big", "rec"); }).find("too large"), std::string::npos);
  EXPECT_EQ(integer_field(j, "n", "rec"), 4);
  EXPECT_NE(bad_input([&] { string_field(j, "s", "rec"); }).find("expected a string"), std::string::npos);
  EXPECT_NE(bad_input([&] { field(j, "missing", "rec"); }).find("missing field \"missing\""),
            std::string::npos);
  EXPECT_NE(bad_input([&] { field(parse_json("[1]", "a"), "k", "a"); }).find("expected an object"),
            std::string::npos);
}

TEST(Json, QuoteEscapesAndKeepsOutputValid) {
  EXPECT_EQ(json_quote("a\"b\\c\nd\x01"), "\"a\\\"b\\\\c\\nd\\u0001\"");
  std::string quoted = json_quote("bad \xff byte");
  EXPECT_EQ(as_string(parse_json(quoted, "q"), "q"), "bad \xef\xbf\xbd byte");  // U+FFFD
  EXPECT_EQ(json_float(0.1f), "0.100000001");
  EXPECT_EQ(json_float(1.0 / 0.0), "null");
}

}  // namespace
}  // namespace moerl::io
