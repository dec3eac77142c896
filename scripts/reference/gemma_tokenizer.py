#!/usr/bin/env python3
"""Builds a tiny Gemma-style tokenizer.json with Hugging Face tokenizers and
records its encodings.

The pipeline is the one transformers' GemmaConverter gives Gemma's
tokenizer.json (convert_slow_tokenizer.py): normalizer Replace(" ", "▁"),
pre-tokenizer Split(" ", merged_with_previous), a BPE model with
byte_fallback and fuse_unk, <pad> <eos> <bos> <unk> as ids 0-3, the
<start_of_turn> and <end_of_turn> special tokens, <0x00>..<0xFF> byte
tokens, a "<bos> $A" post-processor and the decoder Replace("▁", " "),
ByteFallback, Fuse. The vocabulary is trained on a few sentences (the real
one has 262144 pieces and is not needed to exercise the pipeline).

Writes OUT/tokenizer.json, OUT/tokenizer_config.json (Gemma's special
tokens: <bos> added, <eos> ends generation) and OUT/golden.json: for each text, the ids and
token strings HF tokenizers gives (without special tokens) and the decoded
text. internal/tokenizer's TestGoldenGemmaStyle compares Tandem with them.

  ~/.cache/tandem/refenv/bin/python scripts/reference/gemma_tokenizer.py
"""

import argparse
import json
import os

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

CORPUS = [
    "Once upon a time there was a little girl named Lily.",
    "She liked to play in the park with her friends.",
    "The quick brown fox jumps over the lazy dog.",
    "def main():\n\treturn 42  # the answer",
    "Gemma models interleave local and global attention layers.",
]

TEXTS = [
    "Hello world",
    "Once upon a time, Lily played in the park.",
    "  two leading spaces and  two inner",
    "tabs\tand\nnewlines\n\n",
    "naïve café — déjà vu",
    "emoji 🫩 and 日本語",
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "digits 1234567890",
    "",
    " ",
]


def build():
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials, show_progress=False)
    t = Tokenizer(models.BPE(unk_token="<unk>"))
    t.normalizer = normalizers.Replace(" ", "▁")
    t.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    t.train_from_iterator(CORPUS, trainer)
    trained = json.loads(t.to_str())["model"]
    vocab = {s: i for i, s in enumerate(specials)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        if piece not in vocab:
            vocab[piece] = len(vocab)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.add_special_tokens(specials)
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    return tok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="internal/tokenizer/testdata/gemma")
    args = ap.parse_args()
    tok = build()
    os.makedirs(args.out, exist_ok=True)
    tok.save(os.path.join(args.out, "tokenizer.json"))
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump({"add_bos_token": True, "add_eos_token": False, "bos_token": "<bos>", "eos_token": "<eos>",
                   "pad_token": "<pad>", "unk_token": "<unk>", "tokenizer_class": "GemmaTokenizer"}, f, indent=1)
        f.write("\n")
    cases = []
    for text in TEXTS:
        enc = tok.encode(text, add_special_tokens=False)
        cases.append({"text": text, "ids": enc.ids, "tokens": enc.tokens,
                      "decoded": tok.decode(enc.ids, skip_special_tokens=False)})
    with open(os.path.join(args.out, "golden.json"), "w") as f:
        json.dump({"cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {args.out}: {tok.get_vocab_size()} tokens, {len(cases)} cases")


if __name__ == "__main__":
    main()
