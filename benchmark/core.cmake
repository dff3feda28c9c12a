# Core microbenchmarks (Google Benchmark). Links only the core objects.
find_package(benchmark REQUIRED)
add_executable(uvbus_micro_core ${PROJECT_SOURCE_DIR}/benchmark/micro_core.cpp)
target_link_libraries(uvbus_micro_core PRIVATE uvbus_core benchmark::benchmark uvbus_build_flags)
