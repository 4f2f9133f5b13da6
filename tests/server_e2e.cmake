# `daisychain serve` end to end: the HTTP surface (docs/HTTP.md) of a real serve process with
# a node joined through the one public port.
daisy_test(server_e2e_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/server_e2e_test.cc
  LIBS daisy_modelmaker daisy_net daisy_testhub PkgConfig::HTTPLIB nlohmann_json::nlohmann_json
  LABELS "e2e"
  SERIAL
  TIMEOUT 300)
if(TARGET server_e2e_test)
  add_dependencies(server_e2e_test daisychain daisychain_faulty)
endif()
