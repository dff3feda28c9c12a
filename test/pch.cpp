// The executable that owns the test binaries' shared precompiled header (test/CMakeLists.txt,
// uvbus_test_pch); it does nothing.
int main() { return 0; }
