# rollout_bench_mpi: the MPI_Alltoallv baseline of bench/rollout_throughput (built when an MPI
# is found; the only rollout binary linked with MPI).
find_package(MPI COMPONENTS CXX)
if(MPI_CXX_FOUND)
  add_executable(rollout_bench_mpi ${CMAKE_CURRENT_LIST_DIR}/rollout_bench_mpi.cc)
  target_link_libraries(rollout_bench_mpi PRIVATE MPI::MPI_CXX moerl_model moerl_io moerl_tasks
                        moerl_tool_cli)
else()
  message(STATUS "rollout_bench_mpi: no MPI found, bench/rollout_throughput runs without it")
endif()
