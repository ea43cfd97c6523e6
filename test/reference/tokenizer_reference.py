#!/usr/bin/env python3
"""What the Python tokenizers library makes of a list of texts with a tokenizer.json:
for each text the ids (with and without the post-processor's special tokens) and the ids
decoded back, with and without special tokens. test/unit/hf-tokenizer.test.ts checks moerl's
tokenizer (activities/models/tokenizer.ts) against it.

Usage: python3 tokenizer_reference.py TOKENIZER_DIR TEXTS_JSON   (prints one JSON object)
"""
import json
import os
import sys

from tokenizers import Tokenizer


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    tokenizer = Tokenizer.from_file(os.path.join(sys.argv[1], "tokenizer.json"))
    with open(sys.argv[2], encoding="utf-8") as f:
        texts = json.load(f)
    encodings = []
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        encodings.append(
            {
                "ids": ids,
                "ids_with_special": tokenizer.encode(text, add_special_tokens=True).ids,
                "decoded": tokenizer.decode(ids, skip_special_tokens=False),
                "decoded_skip_special": tokenizer.decode(ids, skip_special_tokens=True),
            }
        )
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    print(json.dumps({"vocab_size": vocab_size, "encodings": encodings}, ensure_ascii=False))


if __name__ == "__main__":
    main()
