#!/usr/bin/env python3
"""transformers' apply_chat_template over a list of cases, with the tokenizer directory's own
template or the case's: for each case the prompt rendered without and with the generation
prompt (tokenize=False), and the ids of the latter (tokenize=True). The cases are a JSON
array of {"messages": [...], "chat_template"?: str, "tools"?: [...], "variables"?: {...}}.
test/unit/hf-tokenizer.test.ts checks moerl's renderChat against it.

Usage: python3 chat_reference.py TOKENIZER_DIR CASES_JSON   (prints a JSON array)
"""
import json
import sys

from transformers import AutoTokenizer


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
    with open(sys.argv[2], encoding="utf-8") as f:
        cases = json.load(f)
    results = []
    for case in cases:
        kwargs = dict(chat_template=case.get("chat_template"), tools=case.get("tools"))
        kwargs.update(case.get("variables", {}))

        def render(generation, **more):
            return tokenizer.apply_chat_template(
                case["messages"], add_generation_prompt=generation, **kwargs, **more
            )

        results.append(
            {
                "prompt": render(False, tokenize=False),
                "generation_prompt": render(True, tokenize=False),
                "generation_ids": render(True, tokenize=True, return_dict=False),
            }
        )
    print(json.dumps(results, ensure_ascii=False))


if __name__ == "__main__":
    main()
