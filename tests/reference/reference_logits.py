#!/usr/bin/env python3
"""Independent float64 reference logits for the tiny model-maker presets.

Written from the Hugging Face modeling code (modeling_gpt2.py, modeling_qwen2.py,
modeling_llama.py with _compute_llama3_parameters, modeling_mistral.py with the sliding
window of masking_utils), not from this project's C++: it reads config.json and the
safetensors file itself (header parsed with json + struct, BF16 and F32 widened exactly)
and computes every operation in Python floats (IEEE binary64). Pure Python, no numpy:
the models are tiny (width 64, 2 layers, 256 ids, 32 positions).

For each preset it writes to --out (testdata/reference/):
  <preset>.json             ids, the model's FNV-1a 64 hash, the files below
  <preset>.logits.f32       float32 little-endian (n_ids, vocab): row i is the logits
                            after ids[0..i] (teacher-forced, position i)
  <preset>.<mutant>.f32     the same from a deliberately wrong model (a dropped bias,
                            unscaled RoPE, no window, ...): the C++ test asserts the engine
                            is far from each, so the bound is shown to catch that bug

Regenerate (the C++ test never runs Python; it reads the checked-in files):
  cmake --build build --target make_model
  python3 tests/reference/reference_logits.py --make-model build/tools/make_model \
      --out testdata/reference
"""

import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

# The models: preset, weight seed, dtype (GPT-2 in F32 as the Hub ships it, the others in
# BF16), number of ids, and the wrong models to compute.
CASES = [
    ("ref-gpt2", 21, "f32", 32, ["no_attn_bias", "no_positions", "conv1d_untransposed"]),
    ("ref-qwen2", 22, "bf16", 32, ["no_qkv_bias", "tied_head"]),
    ("ref-llama3", 23, "bf16", 32, ["unscaled_rope"]),
    ("ref-mistral", 24, "bf16", 32, ["no_window", "window_plus_one"]),
]

MUTANT_TEXT = {
    "no_attn_bias": "c_attn bias dropped",
    "no_positions": "learned positions (wpe) dropped",
    "conv1d_untransposed": "attn.c_proj Conv1D weight read as (out, in)",
    "no_qkv_bias": "q/k/v biases dropped",
    "tied_head": "untied lm_head taken tied (embedding used as the head)",
    "unscaled_rope": "rope_scaling llama3 ignored",
    "no_window": "sliding window ignored (full causal attention)",
    "window_plus_one": "sliding window one key too wide (older HF masks)",
}


# --- files --------------------------------------------------------------------------------

def fnv1a64(chunks):
    h = 0xCBF29CE484222325
    for data in chunks:
        for c in data:
            h = ((h ^ c) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def read_safetensors(path):
    """name -> (shape, flat list of floats), widened exactly from BF16 or F32."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = blob[base + a:base + b]
        count = 1
        for d in t["shape"]:
            count *= d
        if t["dtype"] == "F32":
            vals = struct.unpack("<%df" % count, raw)
        elif t["dtype"] == "BF16":
            # a bf16 value is the high half of an f32: put its two bytes there
            wide = bytearray(4 * count)
            wide[2::4] = raw[0::2]
            wide[3::4] = raw[1::2]
            vals = struct.unpack("<%df" % count, bytes(wide))
        else:
            raise SystemExit("%s: dtype %s not handled" % (name, t["dtype"]))
        if len(vals) != count:
            raise SystemExit("%s: %d values for shape %s" % (name, len(vals), t["shape"]))
        out[name] = (t["shape"], list(vals))
    return out


def matrix(tensors, name):
    """A 2-D tensor as a list of rows."""
    shape, v = tensors[name]
    rows, cols = shape
    return [v[r * cols:(r + 1) * cols] for r in range(rows)]


def transpose(m):
    return [list(col) for col in zip(*m)]


# --- maths (float64) ----------------------------------------------------------------------

def linear(x, w, b=None):
    """nn.Linear: y = W x + b with W (out, in)."""
    y = [math.fsum(wi * xi for wi, xi in zip(row, x)) for row in w]
    if b is not None:
        y = [yi + bi for yi, bi in zip(y, b)]
    return y


def rms_norm(x, w, eps):
    # LlamaRMSNorm: x * rsqrt(mean(x^2) + eps), then the weight
    inv = 1.0 / math.sqrt(math.fsum(v * v for v in x) / len(x) + eps)
    return [wi * (v * inv) for wi, v in zip(w, x)]


def layer_norm(x, w, b, eps):
    # nn.LayerNorm: biased variance
    mean = math.fsum(x) / len(x)
    var = math.fsum((v - mean) ** 2 for v in x) / len(x)
    inv = 1.0 / math.sqrt(var + eps)
    return [(v - mean) * inv * wi + bi for v, wi, bi in zip(x, w, b)]


def softmax(s):
    m = max(s)
    e = [math.exp(v - m) for v in s]
    z = math.fsum(e)
    return [v / z for v in e]


def silu(x):
    return x / (1.0 + math.exp(-x))


def gelu_new(x):
    # NewGELUActivation: the tanh approximation
    return 0.5 * x * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def rope_inv_freq(cfg, head_dim, scaled):
    """_compute_default_rope_parameters, then _compute_llama3_parameters when asked."""
    base = float(cfg.get("rope_theta", 10000.0))
    inv = [1.0 / (base ** (i / head_dim)) for i in range(0, head_dim, 2)]
    rs = cfg.get("rope_scaling")
    if not scaled or rs is None:
        return inv
    kind = rs.get("rope_type", rs.get("type"))
    if kind != "llama3":
        raise SystemExit("rope_scaling %r not handled" % kind)
    factor = rs["factor"]
    low = rs["low_freq_factor"]
    high = rs["high_freq_factor"]
    old_len = rs["original_max_position_embeddings"]
    low_wavelen = old_len / low
    high_wavelen = old_len / high
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        g = f / factor if wavelen > low_wavelen else f
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * g / factor + smooth * g
        medium = not (wavelen < high_wavelen) and not (wavelen > low_wavelen)
        out.append(smoothed if medium else g)
    return out


def apply_rope(v, pos, inv_freq):
    # rotate_half: (x1, x2) -> (-x2, x1); cos/sin of cat(freqs, freqs)
    half = len(v) // 2
    out = list(v)
    for i in range(half):
        c, s = math.cos(pos * inv_freq[i]), math.sin(pos * inv_freq[i])
        out[i] = v[i] * c - v[i + half] * s
        out[i + half] = v[i + half] * c + v[i] * s
    return out


def attend(qs, ks, vs, n_heads, n_kv_heads, head_dim, window):
    """Causal attention for every position. qs[i] (n_heads*hd), ks/vs[i] (n_kv*hd).
    window: keys j with j > i - window are visible (masking_utils.sliding_window_overlay);
    0: none."""
    group = n_heads // n_kv_heads
    scale = 1.0 / math.sqrt(head_dim)
    out = []
    for i, q in enumerate(qs):
        first = max(0, i - window + 1) if window > 0 else 0
        row = []
        for h in range(n_heads):
            g = h // group  # repeat_kv
            qh = q[h * head_dim:(h + 1) * head_dim]
            s = [math.fsum(a * b for a, b in zip(qh, ks[j][g * head_dim:(g + 1) * head_dim])) * scale
                 for j in range(first, i + 1)]
            p = softmax(s)
            for d in range(head_dim):
                row.append(math.fsum(p[t] * vs[first + t][g * head_dim + d] for t in range(len(p))))
        out.append(row)
    return out


# --- the families -------------------------------------------------------------------------

def forward_llama(cfg, t, ids, mutant):
    """LlamaForCausalLM / Qwen2ForCausalLM / MistralForCausalLM."""
    arch = cfg["architectures"][0]
    hidden = cfg["hidden_size"]
    n_heads = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_heads)
    hd = cfg.get("head_dim") or hidden // n_heads
    eps = cfg["rms_norm_eps"]
    n_layers = cfg["num_hidden_layers"]
    inv_freq = rope_inv_freq(cfg, hd, scaled=(mutant != "unscaled_rope"))
    window = 0
    if arch == "MistralForCausalLM" and cfg.get("sliding_window"):
        window = cfg["sliding_window"]
    elif arch == "Qwen2ForCausalLM" and cfg.get("use_sliding_window"):
        raise SystemExit("Qwen2 sliding window not handled here")
    if mutant == "no_window":
        window = 0
    elif mutant == "window_plus_one":
        window += 1
    emb = matrix(t, "model.embed_tokens.weight")
    x = [list(emb[i]) for i in ids]
    for layer in range(n_layers):
        p = "model.layers.%d." % layer

        def bias(name):
            if mutant == "no_qkv_bias" or p + name not in t:
                return None
            return t[p + name][1]

        wq, wk, wv = (matrix(t, p + "self_attn.%s_proj.weight" % n) for n in "qkv")
        wo = matrix(t, p + "self_attn.o_proj.weight")
        qs, ks, vs = [], [], []
        for i, row in enumerate(x):
            h = rms_norm(row, t[p + "input_layernorm.weight"][1], eps)
            q = linear(h, wq, bias("self_attn.q_proj.bias"))
            k = linear(h, wk, bias("self_attn.k_proj.bias"))
            v = linear(h, wv, bias("self_attn.v_proj.bias"))
            qs.append([e for hh in range(n_heads) for e in apply_rope(q[hh * hd:(hh + 1) * hd], i, inv_freq)])
            ks.append([e for g in range(n_kv) for e in apply_rope(k[g * hd:(g + 1) * hd], i, inv_freq)])
            vs.append(v)
        att = attend(qs, ks, vs, n_heads, n_kv, hd, window)
        wg = matrix(t, p + "mlp.gate_proj.weight")
        wu = matrix(t, p + "mlp.up_proj.weight")
        wd = matrix(t, p + "mlp.down_proj.weight")
        for i in range(len(x)):
            x[i] = [a + b for a, b in zip(x[i], linear(att[i], wo))]
            h = rms_norm(x[i], t[p + "post_attention_layernorm.weight"][1], eps)
            m = [silu(g) * u for g, u in zip(linear(h, wg), linear(h, wu))]
            x[i] = [a + b for a, b in zip(x[i], linear(m, wd))]
    head = emb
    if not cfg.get("tie_word_embeddings", False) and mutant != "tied_head":
        head = matrix(t, "lm_head.weight")
    return [linear(rms_norm(row, t["model.norm.weight"][1], eps), head) for row in x]


def forward_gpt2(cfg, t, ids, mutant):
    """GPT2LMHeadModel. Conv1D weights are (in, out): y = x W + b."""
    hidden = cfg["n_embd"]
    n_heads = cfg["n_head"]
    hd = hidden // n_heads
    eps = cfg["layer_norm_epsilon"]
    pre = "transformer." if "transformer.wte.weight" in t else ""
    wte = matrix(t, pre + "wte.weight")
    wpe = matrix(t, pre + "wpe.weight")
    x = []
    for i, tok in enumerate(ids):
        pos = [0.0] * hidden if mutant == "no_positions" else wpe[i]
        x.append([a + b for a, b in zip(wte[tok], pos)])

    def conv1d(name, untransposed=False):
        w = matrix(t, name)  # (in, out)
        return w if untransposed else transpose(w)  # as nn.Linear (out, in)

    for layer in range(cfg["n_layer"]):
        p = pre + "h.%d." % layer
        w_attn = conv1d(p + "attn.c_attn.weight")
        b_attn = None if mutant == "no_attn_bias" else t[p + "attn.c_attn.bias"][1]
        w_proj = conv1d(p + "attn.c_proj.weight", untransposed=(mutant == "conv1d_untransposed"))
        qs, ks, vs = [], [], []
        for row in x:
            h = layer_norm(row, t[p + "ln_1.weight"][1], t[p + "ln_1.bias"][1], eps)
            qkv = linear(h, w_attn, b_attn)  # split(n_embd): q, k, v
            qs.append(qkv[:hidden])
            ks.append(qkv[hidden:2 * hidden])
            vs.append(qkv[2 * hidden:])
        att = attend(qs, ks, vs, n_heads, n_heads, hd, 0)
        w_fc = conv1d(p + "mlp.c_fc.weight")
        w_fc_proj = conv1d(p + "mlp.c_proj.weight")
        for i in range(len(x)):
            x[i] = [a + b for a, b in zip(x[i], linear(att[i], w_proj, t[p + "attn.c_proj.bias"][1]))]
            h = layer_norm(x[i], t[p + "ln_2.weight"][1], t[p + "ln_2.bias"][1], eps)
            m = [gelu_new(v) for v in linear(h, w_fc, t[p + "mlp.c_fc.bias"][1])]
            x[i] = [a + b for a, b in zip(x[i], linear(m, w_fc_proj, t[p + "mlp.c_proj.bias"][1]))]
    head = wte if cfg.get("tie_word_embeddings", True) else matrix(t, "lm_head.weight")
    return [linear(layer_norm(row, t[pre + "ln_f.weight"][1], t[pre + "ln_f.bias"][1], eps), head) for row in x]


def forward(model_dir, ids, mutant=None):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    t = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    if cfg["architectures"][0] == "GPT2LMHeadModel":
        return forward_gpt2(cfg, t, ids, mutant)
    return forward_llama(cfg, t, ids, mutant)


# --- driver -------------------------------------------------------------------------------

def token_ids(seed, n, vocab):
    """Deterministic ids from a 64-bit LCG (Knuth's MMIX constants), high bits."""
    s = seed
    out = []
    for _ in range(n):
        s = (s * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        out.append((s >> 33) % vocab)
    return out


def rel_rms(a, b):
    num = math.fsum((x - y) ** 2 for ra, rb in zip(a, b) for x, y in zip(ra, rb))
    den = math.fsum(y * y for rb in b for y in rb)
    return math.sqrt(num / den)


def write_f32(path, rows):
    with open(path, "wb") as f:
        for r in rows:
            f.write(struct.pack("<%df" % len(r), *r))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--make-model", required=True, help="path of the make_model binary")
    ap.add_argument("--out", required=True, help="output folder (testdata/reference)")
    ap.add_argument("--only", help="one preset")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for preset, seed, dtype, n_ids, mutants in CASES:
        if args.only and preset != args.only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([args.make_model, "--preset", preset, "--seed", str(seed), "--dtype", dtype,
                            "--out", tmp], check=True, stdout=subprocess.DEVNULL)
            with open(os.path.join(tmp, "config.json"), "rb") as f:
                config_bytes = f.read()
            with open(os.path.join(tmp, "model.safetensors"), "rb") as f:
                model_bytes = f.read()
            vocab = json.loads(config_bytes)["vocab_size"]
            ids = token_ids(seed, n_ids, vocab)
            logits = forward(tmp, ids)
            manifest = {
                "preset": preset,
                "seed": seed,
                "dtype": dtype,
                "model_fnv1a64": "%016x" % fnv1a64([config_bytes, model_bytes]),
                "ids": ids,
                "vocab": vocab,
                "logits": preset + ".logits.f32",
                "mutants": {},
            }
            write_f32(os.path.join(args.out, manifest["logits"]), logits)
            print("%s: %d ids, logits rms %.4f" % (preset, len(ids),
                  math.sqrt(math.fsum(v * v for r in logits for v in r) / (len(ids) * vocab))))
            for m in mutants:
                wrong = forward(tmp, ids, m)
                name = "%s.%s.f32" % (preset, m)
                write_f32(os.path.join(args.out, name), wrong)
                manifest["mutants"][m] = {"file": name, "what": MUTANT_TEXT[m],
                                          "rel_rms_vs_reference": float("%.4g" % rel_rms(wrong, logits))}
                print("  %-20s rel RMS vs reference %.4f" % (m, rel_rms(wrong, logits)))
        with open(os.path.join(args.out, preset + ".json"), "w") as f:
            json.dump(manifest, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
