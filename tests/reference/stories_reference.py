#!/usr/bin/env python3
"""Float64 teacher-forced reference of stories260K over long texts, for `daisychain eval
--reference` and the accuracy test (src/forward/accuracy_test.cc).

The forward pass is reference_logits.py's (written from Hugging Face's modeling_llama.py,
every operation in Python floats, IEEE binary64); this script only chooses the texts and
writes what the engine is compared with. Texts:
  - two greedy runs of models/stories260K/reference/greedy.json (llama2.c, 202 and 257
    tokens: prompt_ids + continuation_ids);
  - the stories written for this check, testdata/reference/stories260K/<name>.txt (human
    text the model never produced itself), tokenized by the project's tokenizer
    (`daisychain tokenize`, BOS added) and cut to the model's 512 positions.

For each text it writes to --out (testdata/reference/stories260K/):
  <name>.json         ids, the model's FNV-1a 64 hash, the log-probability file
  <name>.logprob.f32  float32 little-endian (len(ids) - 1, vocab): row i is the float64
                      log-softmax of the logits after ids[0..i], rounded once to float32
                      (its error, ~1e-7 relative, is far below the KL bounds measured)

Regenerate (the C++ test never runs Python; it reads the checked-in files); about two
minutes per 512-token text:
  cmake --build build --target daisychain
  python3 tests/reference/stories_reference.py --daisychain build/apps/cli/daisychain \
      --out testdata/reference/stories260K
"""

import argparse
import json
import math
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_logits as ref  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models", "stories260K")
GREEDY = [("greedy_lily_ben", "Lily and Ben went to the park."),
          ("greedy_little_dog", "The little dog was sad because")]
STORIES = ["garden", "boat", "bread"]


def log_softmax(row):
    m = max(row)
    z = math.log(math.fsum(math.exp(v - m) for v in row))
    return [v - m - z for v in row]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--daisychain", required=True, help="path of the daisychain binary (its tokenizer)")
    ap.add_argument("--out", required=True, help="output folder (testdata/reference/stories260K)")
    ap.add_argument("--only", help="one text")
    args = ap.parse_args()
    with open(os.path.join(MODEL, "config.json"), "rb") as f:
        config_bytes = f.read()
    with open(os.path.join(MODEL, "model.safetensors"), "rb") as f:
        model_bytes = f.read()
    cfg = json.loads(config_bytes)
    max_pos = cfg["max_position_embeddings"]
    with open(os.path.join(MODEL, "reference", "greedy.json")) as f:
        greedy = {p["prompt"]: p for p in json.load(f)["prompts"]}
    texts = []
    for name, prompt in GREEDY:
        p = greedy[prompt]
        texts.append((name, "greedy.json: " + prompt, p["prompt_ids"] + p["continuation_ids"]))
    for name in STORIES:
        with open(os.path.join(args.out, name + ".txt"), encoding="utf-8") as f:
            text = f.read()
        out = subprocess.run([args.daisychain, "tokenize", "--model", MODEL, "--json", text], check=True,
                             capture_output=True, text=True).stdout
        ids = json.loads(out)["ids"]
        if len(ids) < max_pos:
            raise SystemExit("%s.txt: %d tokens, want at least %d" % (name, len(ids), max_pos))
        texts.append((name, name + ".txt, first %d tokens" % max_pos, ids[:max_pos]))
    for name, source, ids in texts:
        if args.only and name != args.only:
            continue
        # The last id is only a target: rows 0 .. len(ids) - 2.
        logits = ref.forward(MODEL, ids[:-1])
        rows = [log_softmax(r) for r in logits]
        manifest = {
            "text": name,
            "source": source,
            "model": "models/stories260K",
            "model_fnv1a64": "%016x" % ref.fnv1a64([config_bytes, model_bytes]),
            "ids": ids,
            "vocab": cfg["vocab_size"],
            "logprob": name + ".logprob.f32",
            "logprob_shape": [len(rows), cfg["vocab_size"]],
        }
        with open(os.path.join(args.out, manifest["logprob"]), "wb") as f:
            for r in rows:
                f.write(struct.pack("<%df" % len(r), *r))
        with open(os.path.join(args.out, name + ".json"), "w") as f:
            json.dump(manifest, f)
            f.write("\n")
        agree = sum(1 for i, r in enumerate(rows) if max(range(len(r)), key=r.__getitem__) == ids[i + 1])
        print("%s: %d ids, reference top-1 matches the text at %d of %d positions" % (name, len(ids), agree,
                                                                                       len(rows)))


if __name__ == "__main__":
    sys.exit(main())
