// Shared by the input tests: the message of the BadInput error a call throws.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>

#include "common/check.h"

namespace moerl::testing {

// The message of the BadInput error `fn` throws; fails the test on anything else.
template <typename Fn>
std::string bad_input(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput) << e.what();
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a moerl::Error: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

}  // namespace moerl::testing
