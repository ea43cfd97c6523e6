#!/usr/bin/env python3
"""llama.cpp's own Hugging Face -> GGUF converter (convert_hf_to_gguf.py of the pinned build that
scripts/llamacpp.sh makes), run unchanged but for one option llama.cpp does not have.

  convert.py LLAMACPP_DIR HF_DIR --outfile OUT.gguf --outtype f32 [--pre-tokenizer NAME] [...]

LLAMACPP_DIR is the folder scripts/llamacpp.sh prints (its convert/ holds the converter, its
conversion/ package and the gguf-py it was released with); every other argument is the
converter's. The interpreter needs torch, transformers, numpy, tqdm and PyYAML: the tests run it
with scripts/pyref.sh's.

--pre-tokenizer NAME: llama.cpp recognises a BPE tokenizer's pre-tokenizer by hashing the ids it
gives for a fixed text, so a tokenizer trained by its user (the tests' byte-level BPE with Qwen2's
split pattern) is refused even when its pre-tokenizer is one llama.cpp has. With this option such
a tokenizer is written as NAME (qwen2, llama-bpe, ...); a tokenizer llama.cpp recognises keeps
its own name. Rollouts send token ids, so the pre-tokenizer matters only to text prompts.
"""
import os
import sys


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    llamacpp, args = sys.argv[1], sys.argv[2:]
    pre = None
    if "--pre-tokenizer" in args:
        i = args.index("--pre-tokenizer")
        if i + 1 >= len(args):
            sys.exit("convert.py: --pre-tokenizer needs a name")
        pre = args[i + 1]
        del args[i:i + 2]
    convert = os.path.join(llamacpp, "convert")
    if not os.path.isfile(os.path.join(convert, "convert_hf_to_gguf.py")):
        sys.exit(f"convert.py: no llama.cpp converter in {convert} (bash scripts/llamacpp.sh)")
    sys.path[0:0] = [convert, os.path.join(convert, "gguf-py")]
    import convert_hf_to_gguf
    from conversion import base

    if pre is not None:
        recognise = base.TextModel.get_vocab_base_pre

        def get_vocab_base_pre(self, tokenizer):
            try:
                return recognise(self, tokenizer)
            except NotImplementedError:
                base.logger.warning(f"pre-tokenizer not recognised: written as {pre!r} (--pre-tokenizer)")
                return pre

        base.TextModel.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = [os.path.join(convert, "convert_hf_to_gguf.py"), *args]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
