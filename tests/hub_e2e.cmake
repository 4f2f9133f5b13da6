# Hub end to end: the real daisychain binary and the Hub client against the test Hub server.
daisy_test(hub_e2e_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/hub_e2e_test.cc
  LIBS daisy_hub daisy_model daisy_tensor daisy_testhub daisy_modelmaker nlohmann_json::nlohmann_json
  LABELS "e2e")
