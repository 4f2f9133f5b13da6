// Internal: where the Hugging Face token comes from. Every token found is passed to
// RegisterSecret() before it is returned, so no log line can carry it.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "daisy/status.h"

namespace daisy::hub {

// $HF_TOKEN, else the token file: $HF_TOKEN_PATH, else $HF_HOME/token, else
// ~/.cache/huggingface/token. Surrounding whitespace is trimmed; empty means none.
std::optional<std::string> TokenFromEnvironment();
// Asks for a token with echo off, only when stdin is a terminal. `why` says which repo.
std::optional<std::string> PromptForToken(std::string_view why);
// A token must be a plain printable word: it goes into an HTTP header.
Status CheckTokenChars(std::string_view token);

}  // namespace daisy::hub
