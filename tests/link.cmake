# serve's browser-tab link in one process (rendezvous, relay, link server, port mux, HTTP
# server) with the native test client as the tab and a native member.
daisy_test(link_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/link_test.cc
  LIBS daisy_ring daisy_net daisy_testlink PkgConfig::HTTPLIB)

# The same against a real `daisychain serve`: approval over HTTP, the link on serve's port.
daisy_test(link_e2e_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/link_e2e_test.cc
  LIBS daisy_net daisy_testlink PkgConfig::HTTPLIB nlohmann_json::nlohmann_json
  LABELS "e2e")
if(TARGET link_e2e_test)
  add_dependencies(link_e2e_test daisychain)
endif()
