# MoE policy tools: moe_train (init, sft, grpo, sgemm), moe_generate, moe_reward.
find_package(CLI11 2.1 REQUIRED)  # flag parsing and --help for every tool
add_library(moerl_tool_cli STATIC ${CMAKE_CURRENT_LIST_DIR}/moe_cli.cc)
target_link_libraries(moerl_tool_cli PUBLIC moerl_io moerl_model moerl_rl moerl_common CLI11::CLI11)

add_executable(moe_train ${CMAKE_CURRENT_LIST_DIR}/moe_train.cc)
target_link_libraries(moe_train PRIVATE moerl_rl moerl_tasks moerl_tool_cli)

add_executable(moe_generate ${CMAKE_CURRENT_LIST_DIR}/moe_generate.cc)
target_link_libraries(moe_generate PRIVATE moerl_model moerl_io moerl_tasks moerl_tool_cli)

add_executable(moe_reward ${CMAKE_CURRENT_LIST_DIR}/moe_reward.cc)
target_link_libraries(moe_reward PRIVATE moerl_tasks moerl_tool_cli)

add_executable(moe_hf ${CMAKE_CURRENT_LIST_DIR}/moe_hf.cc)
target_link_libraries(moe_hf PRIVATE moerl_rl moerl_tool_cli)
