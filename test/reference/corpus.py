#!/usr/bin/env python3
"""Deterministic multilingual text for the test tokenizer: English, French, German, Spanish,
Vietnamese, Greek, Russian, Chinese, Japanese and Korean words, made-up words from each
language's syllables, emoji (ZWJ sequences, skin tones, flags), digits, code and odd
whitespace (tabs, runs of spaces, CRLF). make_tokenizer.py trains on training_text(); the
tokenizer tests compare moerl with the Python libraries on test_texts(), another seed of the
same generator plus hand-picked edge cases. Only `random.Random(seed)` is used, whose
sequence Python keeps stable across versions, so the text is the same everywhere.

Usage: python3 corpus.py [--seed S] [--count N]   (prints test_texts(S, N) as a JSON array)
"""
import argparse
import json
import random

# ---------------------------------------------------------------------------
# word lists, one per language: (words, syllables for made-up words, sentence end)

LANGUAGES = {
    "en": (
        "the model learns to reverse a string and add numbers while every rollout "
        "worker may vanish at any moment so only unfinished work is redone "
        "don't we'll she's I'm they're it's can't won't checkpoint expert router".split(),
        ["ba", "ke", "tro", "lin", "ar", "mon", "sh", "qu", "ex", "ing", "tion", "er"],
        ".",
    ),
    "fr": (
        "le modèle apprend à répondre où était la fenêtre déjà été très "
        "français garçon cœur naïve Noël forêt hôpital œuvre à bientôt "
        "l'équipe qu'il c'était".split(),
        ["é", "è", "ê", "ç", "ou", "eau", "ai", "on", "pr", "tr", "ille", "à"],
        ".",
    ),
    "de": (
        "der Schlüssel öffnet die Tür für größere Straßen über Häuser "
        "Mädchen Grüße Übung fröhlich Äpfel weiß Fußball Brötchen".split(),
        ["sch", "ä", "ö", "ü", "ß", "ei", "au", "ung", "lich", "keit", "st", "en"],
        ".",
    ),
    "es": (
        "el niño pequeño comió piña mañana en la montaña señor canción "
        "árbol corazón ¿qué pasa? ¡olé! útil pingüino".split(),
        ["ñ", "á", "í", "ó", "ú", "ci", "que", "ll", "rr", "ión", "ado", "es"],
        ".",
    ),
    "vi": (
        "tiếng Việt có nhiều dấu thanh như người học đường phố Hà Nội "
        "phở bò cảm ơn xin chào những điều".split(),
        ["ng", "nh", "ư", "ơ", "ắ", "ề", "ộ", "ữ", "ỳ", "ạ", "th", "tr"],
        ".",
    ),
    "el": (
        "η γλώσσα των θεών είναι ελληνική και ο λόγος της ψυχής "
        "καλημέρα ευχαριστώ θάλασσα".split(),
        ["κα", "λη", "μέ", "ρα", "θε", "ός", "ψυ", "χή", "ου", "αι", "ει", "ώ"],
        ".",
    ),
    "ru": (
        "модель учится переворачивать строки и складывать числа "
        "привет спасибо ёлка съезд объём щука".split(),
        ["пр", "ив", "ет", "ст", "ов", "ка", "щ", "ё", "ъ", "ы", "ия", "ть"],
        ".",
    ),
    "zh": (
        list("模型学习反转字符串并且把数字相加每个工作者随时可能消失所以只有未完成的工作会被重做")
        + ["专家", "路由", "检查点", "强化学习", "你好", "世界"],
        list("天地玄黄宇宙洪荒日月盈昃辰宿列张寒来暑往秋收冬藏闰余成岁律吕调阳"),
        "。",
    ),
    "ja": (
        "これは テスト です ひらがな カタカナ 漢字 東京 日本語 ありがとう ございます "
        "ラーメン コンピューター".split(),
        list("あいうえおかきくけこさしすせそアイウエオカキクケコ日本語学習"),
        "。",
    ),
    "ko": (
        "안녕하세요 한국어 모델 학습 감사합니다 서울 컴퓨터 사랑".split(),
        list("가나다라마바사아자차카타파하한국어"),
        ".",
    ),
}

EMOJI = [
    "🙂", "🚀", "🔥", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "🇯🇵", "❤️", "🤖", "✨", "🧠", "🐍", "☕",
]
SYMBOLS = ["∑", "∫", "√", "≤", "≥", "π", "°C", "€", "£", "¥", "→", "…", "—", "«", "»", "“", "”", "‘"]
CODE = [
    "def f(x):\n    return x + 1\n",
    "for (let i = 0; i < n; i++) { sum += a[i]; }",
    "if x != None and y >= 3:\n\tprint(f'{x!r}')",
    '{"role": "user", "content": "hi"}',
    "SELECT * FROM rollouts WHERE reward > 0.5;",
    "x_1 = y**2 // 3 % 7",
]
WHITESPACE = [" ", " ", " ", " ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n"]

# ---------------------------------------------------------------------------
# generator


def made_up_word(rng, syllables):
    return "".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))


def sentence(rng):
    words, syllables, end = LANGUAGES[rng.choice(sorted(LANGUAGES))]
    parts = []
    for _ in range(rng.randint(3, 14)):
        r = rng.random()
        if r < 0.55:
            word = rng.choice(words)
        elif r < 0.8:
            word = made_up_word(rng, syllables)
        elif r < 0.87:
            word = str(rng.randint(0, 10 ** rng.randint(1, 7)))
        elif r < 0.93:
            word = rng.choice(EMOJI)
        else:
            word = rng.choice(SYMBOLS)
        if rng.random() < 0.08:
            word = word.upper() if rng.random() < 0.5 else word.capitalize()
        parts.append(word)
        parts.append(rng.choice(WHITESPACE) if rng.random() < 0.15 else " ")
    text = "".join(parts).rstrip(" ") + end
    if rng.random() < 0.07:
        text += " " + rng.choice(CODE)
    return text


def training_text(num_chars=300_000, seed=0):
    """About num_chars characters of paragraphs for training the tokenizer."""
    rng = random.Random(seed)
    paragraphs, size = [], 0
    while size < num_chars:
        paragraph = " ".join(sentence(rng) for _ in range(rng.randint(2, 6)))
        paragraphs.append(paragraph)
        size += len(paragraph) + 2
    return "\n\n".join(paragraphs)


# Inputs a tokenizer gets wrong first: special tokens inside text, whitespace at the edges,
# lone combining marks, decomposed accents (NFC turns them into one character), long digit runs.
EDGE_CASES = [
    "",
    " ",
    "\n",
    "   leading and trailing spaces   ",
    "tabs\tand\t\ttabs",
    "CRLF\r\nline\r\n\r\n",
    "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text<|endoftext|>",
    "<|im_start|> spaced <|im_end|>",
    "<|im_start", "im_end|>",
    "e\u0301 cafe\u0301 n\u0303",
    "\u0301 lone combining mark",
    "1234567890123456789012345678901234567890",
    "I'LL DON'T she'S they'Re",
    "👨‍👩‍👧‍👦👨‍👩‍👧‍👦🏳️‍🌈",
    "\u200b zero width \ufeff bom \u00a0 nbsp",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛 outside the BMP 𠀋",
    "a" * 500,
    "日本語" * 100,
]


def test_texts(seed=1, count=3000):
    """EDGE_CASES, then count generated lines (one to three sentences each)."""
    rng = random.Random(seed)
    generated = [
        " ".join(sentence(rng) for _ in range(rng.randint(1, 3))) for _ in range(count)
    ]
    return EDGE_CASES + generated


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--count", type=int, default=3000)
    args = parser.parse_args()
    print(json.dumps(test_texts(args.seed, args.count), ensure_ascii=False))


if __name__ == "__main__":
    main()
