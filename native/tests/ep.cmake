# EP core tests: ep_test_rank is one rank of a multi-process case; the GoogleTest binaries
# spawn it over shm and tcp on 127.0.0.1.
add_executable(ep_test_rank ${CMAKE_CURRENT_LIST_DIR}/ep_test_rank.cc)
target_link_libraries(ep_test_rank PRIVATE moerl_ep PkgConfig::FABRIC)  # + a stranger endpoint

add_executable(ep_tests
  ${CMAKE_CURRENT_LIST_DIR}/ep_dtype_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/ep_dispatch_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/collectives_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/transport_failure_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/transport_bootstrap_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/transport_hostile_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/transport_locked_memory_test.cc)
target_link_libraries(ep_tests PRIVATE moerl_ep GTest::gtest_main)
target_compile_definitions(ep_tests PRIVATE MOERL_EP_TEST_RANK="$<TARGET_FILE:ep_test_rank>")
add_dependencies(ep_tests ep_test_rank)
gtest_discover_tests(ep_tests DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 120)
