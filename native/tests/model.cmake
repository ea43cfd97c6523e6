# Tests of the MoE policy, the RL losses, checkpoints, sampler and tasks.
add_executable(model_tests
  ${CMAKE_CURRENT_LIST_DIR}/model_ops_test.cc)
target_link_libraries(model_tests PRIVATE moerl_model GTest::gtest_main)
gtest_discover_tests(model_tests DISCOVERY_TIMEOUT 60)
