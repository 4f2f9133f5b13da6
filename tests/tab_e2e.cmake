# The browser tab's ring member as a native process (tab_native: TabMember pumped over the
# test link client) in a ring with serve, a native node and a head: VERIFIED, and killed
# mid-turn.
if(DAISY_BUILD_TESTS)
  add_executable(tab_native ${CMAKE_CURRENT_SOURCE_DIR}/tab_native.cc)
  target_include_directories(tab_native PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/support)
  target_link_libraries(tab_native PRIVATE daisy_tab daisy_ring daisy_testlink daisy_testfaults)
endif()
daisy_test(tab_e2e_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/tab_e2e_test.cc
  LIBS daisy_model daisy_modelmaker daisy_kernels nlohmann_json::nlohmann_json
  LABELS "e2e"
  SERIAL
  TIMEOUT 300)
if(TARGET tab_e2e_test)
  add_dependencies(tab_e2e_test daisychain daisychain_faulty tab_native)
endif()
