# serve's browser-tab link in one process (rendezvous, relay, link server, port mux, HTTP
# server) with the native test client as the tab and a native member.
daisy_test(link_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/link_test.cc
  LIBS daisy_ring daisy_net daisy_testlink PkgConfig::HTTPLIB)
