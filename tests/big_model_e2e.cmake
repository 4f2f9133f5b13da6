# A model bigger than any one device: budgets, stage-by-stage Verify, refusal before download.
daisy_test(big_model_e2e_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/big_model_e2e_test.cc
  LIBS daisy_node daisy_ring daisy_model daisy_tensor daisy_testhub daisy_modelmaker nlohmann_json::nlohmann_json
  LABELS "e2e"
  SERIAL
  TIMEOUT 300)
if(TARGET big_model_e2e_test)
  add_dependencies(big_model_e2e_test daisychain daisychain_faulty)
endif()
