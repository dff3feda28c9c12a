# The bus authenticates registrations with HMAC-SHA256 from OpenSSL's libcrypto (Debian libssl-dev).
find_package(OpenSSL REQUIRED)
if(TARGET uvbus_bus)
  target_link_libraries(uvbus_bus PRIVATE OpenSSL::Crypto)
endif()
list(APPEND UVBUS_EXTRA_LIBS OpenSSL::Crypto)
string(APPEND UVBUS_PC_LIBS_PRIVATE " -lcrypto")
list(APPEND UVBUS_CONFIG_DEPENDENCIES OpenSSL)
