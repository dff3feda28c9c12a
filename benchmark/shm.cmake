# Shared-memory channel benchmarks (DESIGN §5): receiver, sender (N writer processes) and ping-pong
# latency over two rings; run_shm.sh runs them.
foreach(b recv send pingpong)
  add_executable(uvbus_bench_shm_${b} ${PROJECT_SOURCE_DIR}/benchmark/bench_shm_${b}.cpp)
  target_link_libraries(uvbus_bench_shm_${b} PRIVATE uvbus_bench_common)
endforeach()
