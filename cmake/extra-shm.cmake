# uvbus_shm_inspect <url>: prints a shared-memory region's header, fill and counters.
add_executable(uvbus_shm_inspect ${PROJECT_SOURCE_DIR}/tools/shm_inspect.cpp)
target_link_libraries(uvbus_shm_inspect PRIVATE uvbus uvbus_build_flags)
install(TARGETS uvbus_shm_inspect RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
