# Tests of the MoE policy, the RL losses, checkpoints, sampler and tasks.
add_executable(model_tests
  ${CMAKE_CURRENT_LIST_DIR}/model_ops_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/kernels_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/model_golden_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/sampler_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/tasks_test.cc)
target_link_libraries(model_tests PRIVATE moerl_model moerl_tasks GTest::gtest_main)
target_compile_definitions(model_tests PRIVATE MOERL_GOLDEN_DIR="${CMAKE_CURRENT_LIST_DIR}/golden")
gtest_discover_tests(model_tests DISCOVERY_TIMEOUT 60)

add_executable(rl_tests ${CMAKE_CURRENT_LIST_DIR}/rl_test.cc)
target_link_libraries(rl_tests PRIVATE moerl_rl GTest::gtest_main)
gtest_discover_tests(rl_tests DISCOVERY_TIMEOUT 60)

add_executable(checkpoint_tests ${CMAKE_CURRENT_LIST_DIR}/checkpoint_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/json_test.cc ${CMAKE_CURRENT_LIST_DIR}/safetensors_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/hf_input_test.cc)
target_link_libraries(checkpoint_tests PRIVATE moerl_io GTest::gtest_main)
target_compile_definitions(checkpoint_tests PRIVATE MOERL_GOLDEN_DIR="${CMAKE_CURRENT_LIST_DIR}/golden")
gtest_discover_tests(checkpoint_tests DISCOVERY_TIMEOUT 60)

# The real tools as processes: 1 rank vs 2 ranks through the EP core, rank-local checkpoint
# directories (shm provider), command lines, list files, progress lines.
add_executable(model_ep_tests
  ${CMAKE_CURRENT_LIST_DIR}/model_ep_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/model_ep_generate_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint_ranks_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/tools_test.cc)
target_link_libraries(model_ep_tests PRIVATE moerl_io moerl_tasks GTest::gtest_main)
target_compile_definitions(model_ep_tests PRIVATE
  MOERL_MOE_TRAIN="$<TARGET_FILE:moe_train>"
  MOERL_MOE_GENERATE="$<TARGET_FILE:moe_generate>"
  MOERL_MOE_REWARD="$<TARGET_FILE:moe_reward>"
  MOERL_EP_BENCH="$<TARGET_FILE:ep_bench>")
add_dependencies(model_ep_tests moe_train moe_generate moe_reward ep_bench)
gtest_discover_tests(model_ep_tests DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300)

# The committed golden file must be what the reference writes today; a stale file would let
# ModelGolden compare against an outdated reference.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
add_test(NAME ModelGolden.CommittedFileIsTheReferenceOutput
  COMMAND ${CMAKE_COMMAND} -DPYTHON=${Python3_EXECUTABLE}
          -DREFERENCE=${CMAKE_CURRENT_LIST_DIR}/golden/model_reference.py
          -DGOLDEN=${CMAKE_CURRENT_LIST_DIR}/golden/model_tiny.golden
          -DOUT=${CMAKE_CURRENT_BINARY_DIR}/model_tiny.golden
          -P ${CMAKE_CURRENT_LIST_DIR}/golden/regenerate_and_diff.cmake)
