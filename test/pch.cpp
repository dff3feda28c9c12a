// The source of the executable that owns the test binaries' shared precompiled header
// (test/CMakeLists.txt, uvbus_test_pch): no code of its own (its main() is googletest's, and it
// holds no test).
