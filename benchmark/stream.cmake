# Stream channel benchmarks (DESIGN §5): receiver, sender and ping-pong latency; run_stream.sh runs them.
foreach(b recv send pingpong)
  add_executable(uvbus_bench_stream_${b} ${PROJECT_SOURCE_DIR}/benchmark/bench_stream_${b}.cpp)
  target_link_libraries(uvbus_bench_stream_${b} PRIVATE uvbus_bench_common)
endforeach()
