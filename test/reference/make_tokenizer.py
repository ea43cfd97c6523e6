#!/usr/bin/env python3
"""Makes the test models' tokenizer: a byte-level BPE in the Qwen2 style (NFC, Qwen2's
pre-tokenizer pattern, byte-level alphabet, special tokens <|endoftext|> <|im_start|>
<|im_end|> after the learned vocabulary), trained with the `tokenizers` library on
corpus.training_text(), and written as a Hugging Face tokenizer directory: tokenizer.json,
tokenizer_config.json (ChatML chat template, eos <|im_end|>, pad <|endoftext|>) and
special_tokens_map.json. Offline, and byte-identical from run to run (single-threaded
training on a fixed text). transformers' AutoTokenizer.from_pretrained(OUT_DIR) loads it.

Usage: python3 make_tokenizer.py OUT_DIR [--vocab-size N]
  N counts every token, the 3 special ones included (default 4096; up to 32768 works).
"""
import argparse
import json
import os
import sys

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers starts its thread pool

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402

# Qwen2's split pattern: contractions, letter runs with one leading non-letter, single digits,
# punctuation runs, newlines, other whitespace (a last space stays with the next word).
PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

# ChatML as Qwen writes it; the generation prompt opens the assistant's turn.
CHAT_TEMPLATE = (
    "{%- for message in messages %}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)


def train(vocab_size):
    byte_level = dict(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(**byte_level),
        ]
    )
    tokenizer.post_processor = processors.ByteLevel(**byte_level)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS),
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    # About 200 characters of text per token: enough distinct words up to a vocabulary of 32k.
    text = corpus.training_text(num_chars=200 * vocab_size)
    tokenizer.train_from_iterator(text.split("\n\n"), trainer)
    tokenizer.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False, lstrip=False, rstrip=False)
            for t in SPECIAL_TOKENS
        ]
    )
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size != vocab_size:
        sys.exit(f"make_tokenizer: the corpus gives {size} tokens, not --vocab-size {vocab_size}")
    return tokenizer


def tokenizer_config(tokenizer):
    added = {
        str(tokenizer.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS_TOKEN,
        "errors": "replace",
        "model_max_length": 32768,
        "pad_token": PAD_TOKEN,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def write_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, ensure_ascii=False, indent=2, sort_keys=True)
        f.write("\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--vocab-size", type=int, default=4096)
    args = parser.parse_args()
    if args.vocab_size < 256 + len(SPECIAL_TOKENS):
        sys.exit(f"make_tokenizer: --vocab-size {args.vocab_size} is below 259 (256 bytes + 3 specials)")
    tokenizer = train(args.vocab_size)
    os.makedirs(args.out_dir, exist_ok=True)
    tokenizer.save(os.path.join(args.out_dir, "tokenizer.json"), pretty=True)
    write_json(os.path.join(args.out_dir, "tokenizer_config.json"), tokenizer_config(tokenizer))
    write_json(
        os.path.join(args.out_dir, "special_tokens_map.json"),
        {
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
            "eos_token": EOS_TOKEN,
            "pad_token": PAD_TOKEN,
        },
    )


if __name__ == "__main__":
    main()
