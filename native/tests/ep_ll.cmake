# Low-latency EP mode tests: ep_ll_test_rank is one rank of a multi-process case; ep_ll_tests
# spawns it over shm and tcp on 127.0.0.1 and runs the in-process checks.
add_executable(ep_ll_test_rank ${CMAKE_CURRENT_LIST_DIR}/ep_ll_test_rank.cc)
target_link_libraries(ep_ll_test_rank PRIVATE moerl_ep)

add_executable(ep_ll_tests ${CMAKE_CURRENT_LIST_DIR}/ep_ll_test.cc)
target_link_libraries(ep_ll_tests PRIVATE moerl_ep GTest::gtest_main)
target_compile_definitions(ep_ll_tests PRIVATE
                           MOERL_EP_LL_TEST_RANK="$<TARGET_FILE:ep_ll_test_rank>")
# The reference's weighted sums round like the library's (no fused multiply-adds).
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/ep_ll_test_rank.cc PROPERTIES
                            COMPILE_OPTIONS -ffp-contract=off)
add_dependencies(ep_ll_tests ep_ll_test_rank)
gtest_discover_tests(ep_ll_tests DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 120)
