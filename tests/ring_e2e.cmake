# The ring end to end: real processes (serve, nodes, run) on 127.0.0.1.
daisy_test(ring_e2e_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/ring_e2e_test.cc
  LIBS daisy_model daisy_tensor daisy_testhub daisy_modelmaker nlohmann_json::nlohmann_json
  LABELS "e2e"
  SERIAL
  TIMEOUT 600)
if(TARGET ring_e2e_test)
  add_dependencies(ring_e2e_test daisychain daisychain_faulty)
endif()
