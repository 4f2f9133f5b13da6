// --pre-js of the wasm test binaries (tests/wasm/CMakeLists.txt): Emscripten gives a
// program its own environment, not the host's, so DAISY_KERNELS, DAISY_AUDIT_EVERY, ... and
// GTEST_* set for `node test.js` are copied in before main() runs.
Module['preRun'] = Module['preRun'] || [];
Module['preRun'].push(function () {
  for (const name of Object.keys(process.env)) {
    if (name.startsWith('DAISY_') || name.startsWith('GTEST_')) ENV[name] = process.env[name];
  }
});
