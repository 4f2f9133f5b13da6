# The web UI and the OpenAI-compatible API end to end: Node 20 scripts in tests/web drive a
# real `daisychain serve` (and nodes) on 127.0.0.1 — headless Debian chromium through
# playwright-core, and the official `openai` npm client. scripts/install-deps.sh installs
# chromium and runs `npm ci` in tests/web; a missing piece fails the test with a message
# saying so (never a skip).
find_program(DAISY_NODE_EXECUTABLE NAMES node nodejs)
set(DAISY_WEB_TEST_DIR ${CMAKE_CURRENT_SOURCE_DIR}/web)
set(DAISY_WEB_ARTIFACT_DIR ${CMAKE_BINARY_DIR}/artifacts)

foreach(t browser openai chat_api chat_browser token_browser qr_browser join_browser tab_ring_browser
          tab_phone_browser)
  if(DAISY_NODE_EXECUTABLE)
    set(cmd ${DAISY_NODE_EXECUTABLE} ${DAISY_WEB_TEST_DIR}/${t}_test.mjs)
  else()
    set(cmd sh -c "echo 'node (Node.js 20) not found when CMake ran: run scripts/install-deps.sh and configure again' >&2; exit 1")
  endif()
  add_test(NAME web_${t}_test COMMAND ${cmd} WORKING_DIRECTORY ${DAISY_WEB_TEST_DIR})
  set_tests_properties(web_${t}_test PROPERTIES
    LABELS "web;e2e"
    RUN_SERIAL TRUE
    TIMEOUT 180
    ENVIRONMENT "DAISY_BIN_DIR=$<TARGET_FILE_DIR:daisychain>;DAISY_MODELS=${CMAKE_SOURCE_DIR}/models;DAISY_ARTIFACT_DIR=${DAISY_WEB_ARTIFACT_DIR}")
endforeach()
# Three rings with a browser tab (serve, two nodes, the test Hub, a head each time).
if(TEST web_tab_ring_browser_test)
  set_tests_properties(web_tab_ring_browser_test PROPERTIES TIMEOUT 420)
endif()
