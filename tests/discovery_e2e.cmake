# Finding a room on a LAN: serve and a node without --join in two network namespaces the test
# makes (a veth pair on a private /24), as root; skipped otherwise. Never on shared interfaces.
daisy_test(discovery_e2e_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/discovery_e2e_test.cc
  LIBS daisy_ring daisy_net nlohmann_json::nlohmann_json
  LABELS "e2e"
  SERIAL
  TIMEOUT 300)
if(TARGET discovery_e2e_test)
  add_dependencies(discovery_e2e_test daisychain)
endif()
