# Bus node benchmarks: receiver, sender and ping-pong latency; run_bus.sh runs them.
foreach(b recv send latency)
  add_executable(uvbus_bench_node_${b} ${PROJECT_SOURCE_DIR}/benchmark/bench_node_${b}.cpp)
  target_link_libraries(uvbus_bench_node_${b} PRIVATE uvbus_bench_common)
endforeach()
