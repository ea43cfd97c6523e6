# ep_bench: EP dispatch/combine benchmark; ep_bench_mpi: its MPI_Alltoallv baseline (built
# when an MPI is found; ep_bench then launches it through mpirun in the same run).
add_executable(ep_bench ${CMAKE_CURRENT_LIST_DIR}/ep_bench.cc)
target_link_libraries(ep_bench PRIVATE moerl_ep)

find_package(MPI COMPONENTS CXX)
if(MPI_CXX_FOUND)
  add_executable(ep_bench_mpi ${CMAKE_CURRENT_LIST_DIR}/ep_bench_mpi.cc)
  target_link_libraries(ep_bench_mpi PRIVATE MPI::MPI_CXX moerl_ep)
  target_compile_definitions(ep_bench PRIVATE MOERL_EP_BENCH_MPIEXEC="${MPIEXEC_EXECUTABLE}")
  add_dependencies(ep_bench ep_bench_mpi)
else()
  message(STATUS "ep_bench: no MPI found, the MPI_Alltoallv baseline is not built")
endif()

# ep_bench_ll: latency of the low-latency mode at a decode shape, next to memcpy.
add_executable(ep_bench_ll ${CMAKE_CURRENT_LIST_DIR}/ep_bench_ll.cc)
target_link_libraries(ep_bench_ll PRIVATE moerl_ep)
