# Bus example: a gateway and two logic nodes (examples/bus_gateway.cpp), built as uvbus_example_bus.
add_executable(uvbus_example_bus ${PROJECT_SOURCE_DIR}/examples/bus_gateway.cpp)
target_link_libraries(uvbus_example_bus PRIVATE uvbus uvbus_build_flags)
