// Tokenizer: the Hugging Face `tokenizer.json` pipeline (added tokens, normalizer,
// pre-tokenizer, BPE model, post-processor, decoder) reproduced exactly as the Rust
// `tokenizers` library runs it, plus the `tokenizer_config.json` settings that Python
// transformers applies on top (add_bos_token / add_eos_token for the Llama family,
// clean_up_tokenization_spaces). docs/TOKENIZER.md lists what is supported and refused.
//
// Anything the loader does not know (a Unigram or WordPiece model, an unknown normalizer,
// pre-tokenizer, post-processor or decoder type) is refused with a message naming it;
// nothing is approximated.
//
// Invalid UTF-8 policy: Encode() never fails on text. Each maximal ill-formed subsequence
// of the input (as Rust's String::from_utf8_lossy defines it) is replaced by U+FFFD
// before anything else runs, so the result is the encoding of the lossy-decoded string.
//
// Thread safety: a Tokenizer is immutable after loading except for an internal word cache
// guarded by a mutex, so its const methods may be called from any number of threads at
// once. It is movable, not copyable.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "daisy/source.h"
#include "daisy/status.h"

namespace daisy {

class Tokenizer {
 public:
  // Reads tokenizer.json and, when the source has one, tokenizer_config.json.
  static Result<Tokenizer> Load(ModelSource& src);
  // Builds from the two files' contents; tokenizer_config_json may be empty (absent).
  static Result<Tokenizer> FromJson(std::string_view tokenizer_json, std::string_view tokenizer_config_json);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;
  ~Tokenizer();

  // Token ids of `text`. With add_special_tokens the post-processor adds its special tokens
  // (BOS for Llama-3 and Mistral). Special-token text inside `text` is matched as an added
  // token either way. Fails only on a tokenizer defect found at run time (e.g. an
  // unk_token missing from the vocabulary), never because of the text.
  Result<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens) const;

  // Text of `ids` through the decoder chain. Ids outside the vocabulary are skipped.
  // cleanup: apply transformers' clean_up_tokenization; nullopt = the config's default.
  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens,
                     std::optional<bool> cleanup = std::nullopt) const;

  // The vocabulary string of one id (byte-level pieces as stored, e.g. "Ġthe");
  // "" for an id outside the vocabulary.
  std::string IdToPiece(int32_t id) const;
  std::optional<int32_t> TokenToId(std::string_view token) const;
  // One more than the largest id of the model vocabulary and the added tokens.
  int32_t vocab_size() const;
  // From tokenizer_config.json's bos_token / eos_token, when set and in the vocabulary.
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  // True for ids of added tokens marked "special" (the ones skip_special_tokens drops).
  bool IsSpecial(int32_t id) const;

 private:
  struct Impl;
  static Result<std::unique_ptr<Impl>> Build(std::string_view tokenizer_json, std::string_view config_json);
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The text of a growing sequence of ids, as it can be shown. Decodes the whole sequence
// each time (decoders strip or merge across token boundaries, so pieces alone are not the
// text) and hands out only what is new and stable: nothing while a multi-byte character
// is incomplete (byte fallback shows U+FFFD until its last byte), nothing while a decoder
// is rewriting earlier text. Not thread-safe; holds a reference to the tokenizer.
class TextStream {
 public:
  // `context`: ids already shown (usually the prompt); the stream starts after them.
  TextStream(const Tokenizer& tokenizer, std::vector<int32_t> context);
  // Adds one id; returns the text that became stable (often empty).
  std::string Add(int32_t id);
  // Returns whatever is left to show.
  std::string Finish();
  // The context's own text, and the text after it.
  const std::string& context_text() const { return context_text_; }
  std::string Completion() const;

 private:
  const Tokenizer& tok_;
  std::vector<int32_t> ids_;
  size_t context_len_ = 0;
  std::string context_text_;
  std::string shown_;  // context_text_'s stable prefix + everything handed out
};

}  // namespace daisy
