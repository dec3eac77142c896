#!/usr/bin/env bash
# Compares Tandem with its references live:
# - Hugging Face transformers: installs the pinned torch and transformers
#   (CPU) into a virtual environment, builds fresh tiny checkpoints of every
#   family transformers_goldens.py knows (Qwen3, Qwen3-MoE, Mixtral, ...)
#   with transformers and runs internal/model's TestMatchesTransformers on
#   them; then checks that the installed transformers still computes the
#   goldens committed under internal/model/testdata (which CI checks without
#   the reference); and that Hugging Face tokenizers rebuilds the Gemma-style
#   tokenizer fixture and its goldens as committed.
# - llama.cpp: installs node-llama-cpp 3.21.1 (prebuilt llama.cpp) in
#   scripts/reference/llamacpp and runs TestGGUFQwen3MatchesLlamaCpp, which
#   compares greedy continuations on GGUF files Tandem writes.
#
#   scripts/reference/check.sh            # venv in ~/.cache/tandem/refenv
#   TANDEM_REFENV=/some/venv scripts/reference/check.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=${TANDEM_REFENV:-$HOME/.cache/tandem/refenv}
if [ ! -x "$venv/bin/python" ]; then
	python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q -r "$root/scripts/reference/requirements.txt"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$venv/bin/python" "$root/scripts/reference/transformers_goldens.py" --out "$out"
(cd "$root" && TANDEM_HF_REFERENCE="$out" go test -count=1 -run TestMatchesTransformers -v ./internal/model/)
"$venv/bin/python" "$root/scripts/reference/transformers_goldens.py" --check --out "$root/internal/model/testdata"
# The Gemma-style tokenizer: Hugging Face tokenizers rebuilds it and its
# goldens, which must be the committed ones.
"$venv/bin/python" "$root/scripts/reference/gemma_tokenizer.py" --out "$out/gemma-tokenizer"
diff -r "$out/gemma-tokenizer" "$root/internal/tokenizer/testdata/gemma"
(cd "$root/scripts/reference/llamacpp" && npm ci --no-audit --no-fund)
(cd "$root" && TANDEM_LLAMACPP="$root/scripts/reference/llamacpp" go test -count=1 -run TestGGUFQwen3MatchesLlamaCpp -v ./internal/model/)
