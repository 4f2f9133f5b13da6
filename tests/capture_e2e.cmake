# A loopback capture (tcpdump, as root) of a whole ring run: no plaintext prompt, text or
# activations. Serial: other tests' plaintext HTTP (the test Hub) must not share the capture.
daisy_test(capture_e2e_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/capture_e2e_test.cc
  LIBS nlohmann_json::nlohmann_json
  LABELS "e2e"
  SERIAL
  TIMEOUT 300)
