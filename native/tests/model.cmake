# Tests of the MoE policy, the RL losses, checkpoints, sampler and tasks.
add_executable(model_tests
  ${CMAKE_CURRENT_LIST_DIR}/model_ops_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/model_golden_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/sampler_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/tasks_test.cc)
target_link_libraries(model_tests PRIVATE moerl_model moerl_tasks GTest::gtest_main)
target_compile_definitions(model_tests PRIVATE MOERL_GOLDEN_DIR="${CMAKE_CURRENT_LIST_DIR}/golden")
gtest_discover_tests(model_tests DISCOVERY_TIMEOUT 60)

add_executable(checkpoint_tests ${CMAKE_CURRENT_LIST_DIR}/checkpoint_test.cc)
target_link_libraries(checkpoint_tests PRIVATE moerl_io GTest::gtest_main)
gtest_discover_tests(checkpoint_tests DISCOVERY_TIMEOUT 60)
