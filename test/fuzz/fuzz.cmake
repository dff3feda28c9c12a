# libFuzzer targets (included by the top CMakeLists.txt when -DUVBUS_BUILD_FUZZERS=ON).
#
# Configure a separate build directory with clang:
#   cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DUVBUS_BUILD_FUZZERS=ON \
#         -DUVBUS_BUILD_TESTS=OFF -DUVBUS_BUILD_BENCHMARKS=OFF
# then scripts/fuzz.sh runs every target for a bounded time.
#
# Every test/fuzz/fuzz_<name>.cpp becomes the executable fuzz_<name>. It is built only when the
# components it needs exist (a "// uvbus-fuzz-needs: comp ..." line in the source lists them), so
# this file works while the stream, shm and bus components are still being written. A
# "// uvbus-fuzz-sources: src/x/y.cpp ..." line compiles just those library sources into the
# target instead of linking their whole component (e.g. the bus protocol parsers without the node,
# which would drag in every channel).
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "UVBUS_BUILD_FUZZERS needs clang (-DCMAKE_CXX_COMPILER=clang++)")
endif()

# The library objects must carry the coverage instrumentation too (fuzzer-no-link), or libFuzzer
# sees only the harness and explores blindly; and ASan/UBSan must check the library code, which
# is where the findings live. UBSan does not recover, so every report is a crash libFuzzer keeps.
set(UVBUS_FUZZ_FLAGS -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all
                     -fno-omit-frame-pointer -g)
foreach(comp IN LISTS UVBUS_PRESENT_COMPONENTS)
  target_compile_options(uvbus_${comp} PRIVATE ${UVBUS_FUZZ_FLAGS})
endforeach()

file(GLOB UVBUS_FUZZ_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/test/fuzz/fuzz_*.cpp)
set(UVBUS_FUZZ_TARGETS)
foreach(src IN LISTS UVBUS_FUZZ_SOURCES)
  get_filename_component(name ${src} NAME_WE)
  file(STRINGS ${src} needs_line REGEX "^// uvbus-fuzz-needs:")
  set(needs core)
  if(needs_line)
    string(REGEX REPLACE "^// uvbus-fuzz-needs:[ ]*" "" needs "${needs_line}")
    separate_arguments(needs)
  endif()
  file(STRINGS ${src} sources_line REGEX "^// uvbus-fuzz-sources:")
  set(extra_sources)
  if(sources_line)
    string(REGEX REPLACE "^// uvbus-fuzz-sources:[ ]*" "" rel "${sources_line}")
    separate_arguments(rel)
    foreach(f IN LISTS rel)
      list(APPEND extra_sources ${PROJECT_SOURCE_DIR}/${f})
    endforeach()
  endif()
  set(missing FALSE)
  foreach(dep IN LISTS needs)
    if(NOT TARGET uvbus_${dep})
      set(missing TRUE)
    endif()
  endforeach()
  foreach(f IN LISTS extra_sources)
    if(NOT EXISTS ${f})
      set(missing TRUE)
    endif()
  endforeach()
  if(missing)
    message(STATUS "fuzz: skipping ${name} (needs components: ${needs})")
    continue()
  endif()
  add_executable(${name} ${src} ${extra_sources})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/test/fuzz
                                             ${PROJECT_SOURCE_DIR}/src)
  foreach(dep IN LISTS needs)
    target_link_libraries(${name} PRIVATE uvbus_${dep})
  endforeach()
  target_link_libraries(${name} PRIVATE ${UVBUS_EXTRA_LIBS} rt uvbus_build_flags)
  target_compile_options(${name} PRIVATE -fsanitize=fuzzer,address,undefined
                                         -fno-sanitize-recover=all -fno-omit-frame-pointer -g)
  target_link_options(${name} PRIVATE -fsanitize=fuzzer,address,undefined)
  list(APPEND UVBUS_FUZZ_TARGETS ${name})
endforeach()

add_custom_target(uvbus_fuzzers DEPENDS ${UVBUS_FUZZ_TARGETS})
message(STATUS "fuzz targets: ${UVBUS_FUZZ_TARGETS}")
