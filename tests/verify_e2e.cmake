# Verify through the real binary: serve and run as processes, a rigged node in the test.
daisy_test(verify_e2e_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/verify_e2e_test.cc
  LIBS daisy_node daisy_net daisy_testfaults nlohmann_json::nlohmann_json
  LABELS "e2e"
  SERIAL
  TIMEOUT 180)
if(TARGET verify_e2e_test)
  add_dependencies(verify_e2e_test daisychain)
endif()
