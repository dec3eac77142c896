#!/usr/bin/env python3
"""Builds tiny random checkpoints with Hugging Face transformers and records
transformers' own logits for them.

Families (each a directory under --out): qwen3 (Qwen3, Qwen3-MoE), mixtral,
mistral (sliding-window attention), gemma3, smollm3 (layers without RoPE),
phi3 (fused projections, partial rotary, longrope), llama (Llama 3.x RoPE
scaling). For each case it writes, under
OUT/<family>/<case>/:
  config.json, generation_config.json, model.safetensors  (save_pretrained, f32)
  golden.json: prompt_ids, the logits of every prompt position (row-major,
  positions x vocab) and greedy_ids (the prompt then GREEDY tokens, each the
  argmax of a full forward pass over everything before it).

With --check it instead loads each case's checkpoint from OUT, recomputes
the goldens with the installed transformers and compares them with
golden.json there (the live comparison; internal/model's Go test compares
Tandem with the same golden.json).

Install: python3 -m venv ~/.cache/tandem/refenv &&
~/.cache/tandem/refenv/bin/pip install -r scripts/reference/requirements.txt
"""

import argparse
import json
import os
import sys

import torch
import transformers

PROMPT = [3, 17, 42, 99, 7, 64, 1, 120, 33, 88, 5, 71]
# A prompt longer than one 64-key attention chunk, for windows that cross
# a chunk boundary.
LONG_PROMPT = [(i * 37 + 11) % 128 for i in range(72)]
GREEDY = 8
VOCAB = 128

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=12,  # != hidden_size / num_attention_heads (8)
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    initializer_range=0.2,
    bos_token_id=1,
    eos_token_id=2,
)

QWEN = dict(COMMON, attention_bias=False, use_sliding_window=False)

# family -> case -> (model class, config class, config fields[, prompt]).
# Seeds are 1000 + the case's index within its family, so adding a family
# leaves the others' checkpoints as they were.
FAMILIES = {
    "qwen3": {
        "qwen3-tied": ("Qwen3ForCausalLM", "Qwen3Config", dict(QWEN,
            num_hidden_layers=2, intermediate_size=48, tie_word_embeddings=True)),
        "qwen3-untied": ("Qwen3ForCausalLM", "Qwen3Config", dict(QWEN,
            num_hidden_layers=3, intermediate_size=40, tie_word_embeddings=False,
            num_key_value_heads=1)),
        # 8 experts, top-2 with normalised weights; layer 0 dense (mlp_only_layers).
        "qwen3moe-norm": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(QWEN,
            num_hidden_layers=3, intermediate_size=48, moe_intermediate_size=16,
            num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
            decoder_sparse_step=1, mlp_only_layers=[0], tie_word_embeddings=False)),
        # Unnormalised top-3 weights; decoder_sparse_step 2 makes layers 1 and 3
        # sparse, 0 and 2 dense; tied head.
        "qwen3moe-nonorm": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(QWEN,
            num_hidden_layers=4, intermediate_size=40, moe_intermediate_size=16,
            num_experts=8, num_experts_per_tok=3, norm_topk_prob=False,
            decoder_sparse_step=2, mlp_only_layers=[], tie_word_embeddings=True)),
    },
    "mixtral": {
        # 8 experts, top-2 (Mixtral's softmax, top-k, renormalise), every
        # layer sparse, untied head.
        "mixtral-top2": ("MixtralForCausalLM", "MixtralConfig", dict(COMMON,
            num_hidden_layers=2, intermediate_size=16, num_local_experts=8,
            num_experts_per_tok=2, tie_word_embeddings=False, sliding_window=None)),
        # Top-3 of 4, tied head, and a sliding window of 5 (smaller than the
        # prompt): windowed attention in every layer.
        "mixtral-window": ("MixtralForCausalLM", "MixtralConfig", dict(COMMON,
            num_hidden_layers=3, intermediate_size=16, num_local_experts=4,
            num_experts_per_tok=3, tie_word_embeddings=True, sliding_window=5)),
    },
    "mistral": {
        # A window of 67 over a 72-token prompt: late queries' windows start
        # inside the first 64-key chunk.
        "mistral-window67": ("MistralForCausalLM", "MistralConfig", dict(COMMON,
            num_hidden_layers=2, intermediate_size=40, tie_word_embeddings=False,
            sliding_window=67), LONG_PROMPT),
        # Qwen2 with use_sliding_window: only layers from max_window_layers
        # (1) on are windowed, with a window of 7.
        "qwen2-maxwindow": ("Qwen2ForCausalLM", "Qwen2Config", dict(COMMON,
            num_hidden_layers=3, intermediate_size=40, tie_word_embeddings=True,
            use_sliding_window=True, sliding_window=7, max_window_layers=1), LONG_PROMPT),
    },
    "gemma3": {
        # Local (window 5, RoPE base 10000) and global layers (base 1e6),
        # query_pre_attn_scalar 16 != head_dim 12, tied head.
        "gemma3-tied": ("Gemma3ForCausalLM", "Gemma3TextConfig", dict(COMMON,
            num_hidden_layers=4, intermediate_size=40, tie_word_embeddings=True,
            sliding_window=5, query_pre_attn_scalar=16,
            layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}})),
        # A window of 67 over 72 tokens, linear RoPE scaling (factor 8) of
        # the global layers as Gemma 3 4B and up have, final logit
        # soft-capping, untied head.
        "gemma3-long": ("Gemma3ForCausalLM", "Gemma3TextConfig", dict(COMMON,
            num_hidden_layers=3, intermediate_size=40, tie_word_embeddings=False,
            sliding_window=67, query_pre_attn_scalar=12, final_logit_softcapping=3.0,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}}),
            LONG_PROMPT),
    },
    "smollm3": {
        # Every 4th layer without RoPE (no_rope_layer_interval's default,
        # the pattern llama.cpp's smollm3 assumes: layer 3 of 5), RoPE base
        # 2e6, tied head.
        "smollm3-nope": ("SmolLM3ForCausalLM", "SmolLM3Config", dict(COMMON,
            num_hidden_layers=5, intermediate_size=40, tie_word_embeddings=True,
            rope_theta=2000000.0, pad_token_id=0)),
        # An explicit no_rope_layers (layer 1 without RoPE), whose NoPE layer
        # has a window of 5 (use_sliding_window), attention biases, untied
        # head.
        "smollm3-window": ("SmolLM3ForCausalLM", "SmolLM3Config", dict(COMMON,
            num_hidden_layers=3, intermediate_size=40, tie_word_embeddings=False,
            no_rope_layers=[1, 0, 1], use_sliding_window=True, sliding_window=5,
            attention_bias=True, pad_token_id=0)),
    },
    "llama": {
        # Llama 3.1/3.2's rope_scaling (rope_type llama3): with head_dim 12,
        # base 1e6 and original_max_position_embeddings 64 the frequencies
        # fall in all three bands (kept, smoothed, divided by factor 8).
        "llama3-rope": ("LlamaForCausalLM", "LlamaConfig", dict(COMMON,
            num_hidden_layers=2, intermediate_size=40, tie_word_embeddings=True,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    },
    "phi3": {
        # Fused qkv_proj and gate_up_proj, RoPE on half of each head
        # (partial_rotary_factor 0.5: 6 of 12 dimensions), untied head.
        "phi3-partial": ("Phi3ForCausalLM", "Phi3Config", dict(COMMON,
            num_hidden_layers=2, intermediate_size=40, tie_word_embeddings=False,
            partial_rotary_factor=0.5, pad_token_id=0, sliding_window=None)),
        # Phi-4-mini's features: partial_rotary_factor 0.75 (12 of 16
        # dimensions, head_dim = hidden/heads as Phi3Config checks), longrope
        # (short factors used up to
        # original_max_position_embeddings 64; max_position_embeddings 256
        # makes the attention factor √(1 + ln 4 / ln 64)), tied head, a
        # window longer than the positions.
        "phi4mini-longrope": ("Phi3ForCausalLM", "Phi3Config", dict(COMMON,
            num_hidden_layers=3, intermediate_size=40, tie_word_embeddings=True,
            hidden_size=64, head_dim=16, partial_rotary_factor=0.75, pad_token_id=0,
            original_max_position_embeddings=64, sliding_window=1024,
            rope_scaling={"rope_type": "longrope", "rope_theta": 10000.0,
                          "short_factor": [1.0, 1.1, 1.3, 1.7, 2.3, 3.1],
                          "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]})),
        # Phi-3-mini-4k's window in every layer (2047 there), here 5: shorter
        # than the prompt.
        "phi3-window": ("Phi3ForCausalLM", "Phi3Config", dict(COMMON,
            num_hidden_layers=2, intermediate_size=40, tie_word_embeddings=False,
            pad_token_id=0, sliding_window=5)),
    },
}


def cases():
    for family, cs in FAMILIES.items():
        for i, (name, spec) in enumerate(cs.items()):
            yield family, name, i, spec


def build(spec, seed):
    model_cls, config_cls, fields = spec[:3]
    config = getattr(transformers, config_cls)(**fields)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).to(torch.float32).eval()
    with torch.no_grad():
        # Norm weights start at exactly 1 (0 for Gemma's 1 + weight); jitter
        # them so that a misapplied norm (q_norm on the wrong axis, say)
        # changes the logits.
        for pname, p in model.named_parameters():
            if "norm" in pname:
                base = 0 if "Gemma" in model_cls else 1
                p.copy_(base + 0.2 * torch.randn_like(p))
    return model


def goldens(model, prompt):
    with torch.no_grad():
        ids = torch.tensor([prompt])
        logits = model(ids).logits[0].to(torch.float32)
        seq = list(prompt)
        for _ in range(GREEDY):
            out = model(torch.tensor([seq])).logits[0, -1]
            seq.append(int(torch.argmax(out)))
    return {
        "prompt_ids": prompt,
        "vocab": VOCAB,
        # 9 significant digits round-trip an f32.
        "logits": [float(f"{v:.9g}") for v in logits.reshape(-1).tolist()],
        "greedy_ids": seq,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }


def prompt_of(spec):
    return spec[3] if len(spec) > 3 else PROMPT


def write(out, families):
    for family, name, i, spec in cases():
        if family not in families:
            continue
        d = os.path.join(out, family, name)
        model = build(spec, 1000 + i)
        model.save_pretrained(d, safe_serialization=True)
        g = goldens(model, prompt_of(spec))
        with open(os.path.join(d, "golden.json"), "w") as f:
            json.dump(g, f)
            f.write("\n")
        print(f"{family}/{name}: wrote {d}")


def check(out, families):
    worst = 0.0
    bad = False
    for family, name, _, spec in cases():
        if family not in families:
            continue
        d = os.path.join(out, family, name)
        model = getattr(transformers, spec[0]).from_pretrained(d, dtype=torch.float32).eval()
        g = goldens(model, prompt_of(spec))
        with open(os.path.join(d, "golden.json")) as f:
            want = json.load(f)
        diff = max(abs(a - b) for a, b in zip(g["logits"], want["logits"]))
        scale = max(abs(b) for b in want["logits"])
        worst = max(worst, diff / scale)
        same = g["greedy_ids"] == want["greedy_ids"]
        bad |= not same or diff > 1e-4 * scale
        print(f"{family}/{name}: max |logit diff| {diff:.3g} (logit scale {scale:.3g}), greedy ids {'equal' if same else 'DIFFER'}")
    if bad:
        sys.exit(f"transformers disagrees with the committed goldens (worst relative diff {worst:.3g})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="internal/model/testdata", help="where the families' directories are written")
    ap.add_argument("--family", action="append", choices=list(FAMILIES), help="only these families (repeatable; default all)")
    ap.add_argument("--check", action="store_true", help="recompute the goldens of the cases in --out and compare")
    args = ap.parse_args()
    families = set(args.family or FAMILIES)
    torch.set_num_threads(1)
    if args.check:
        check(args.out, families)
    else:
        write(args.out, families)


if __name__ == "__main__":
    main()
