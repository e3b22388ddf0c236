"""Writes the model directory Dynamo's frontend and mocker engines serve in the test bed.

Dynamo's frontend needs a Hugging Face model directory: a `config.json` (the mocker derives the
KV bytes per token from it) and a tokenizer. Nothing may be downloaded from a model hub here, so
this writes a small one: a Llama-shaped `config.json` (TinyLlama's dimensions) with a context
long enough for the longest prompts of the bench traces, and a word-level tokenizer of 32,000
entries in which every whitespace-separated word is one token. A prompt of N words is then
exactly N tokens, so a load generator controls the prompt length the frontend reports.

Usage: python make_model.py OUT_DIR [--context TOKENS]
"""

import argparse
import json
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers

VOCAB = 32000
SPECIAL = ["<unk>", "<s>", "</s>"]
# A few real words so a human reading a prompt sees text; the rest are w0, w1, ...
WORDS = ["the", "a", "of", "and", "to", "in", "is", "it", "that", "for",
         "on", "with", "as", "at", "by", "this", "be", "are", "from"]


def write_config(out: Path, context: int) -> None:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "max_position_embeddings": context,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 22,
        "num_key_value_heads": 4,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": VOCAB,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2}, indent=2) + "\n")


def write_tokenizer(out: Path, context: int) -> None:
    words = SPECIAL + WORDS
    words += [f"w{i}" for i in range(VOCAB - len(words))]
    vocab = {word: i for i, word in enumerate(words)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(SPECIAL)
    tokenizer.save(str(out / "tokenizer.json"))
    # The chat template joins the messages' contents with spaces and adds nothing else, so a
    # chat request's prompt tokens are its words.
    template = "{% for message in messages %}{{ message['content'] }} {% endfor %}"
    tokenizer_config = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": context,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": template,
        "add_bos_token": False,
        "add_eos_token": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    # Mooncake's longest prompt is 126,527 tokens.
    parser.add_argument("--context", type=int, default=131072)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    write_config(args.out, args.context)
    write_tokenizer(args.out, args.context)


if __name__ == "__main__":
    main()
