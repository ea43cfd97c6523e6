#!/usr/bin/env python3
"""Multi-turn episodes built turn by turn with transformers' apply_chat_template, the rule of
activities/agents/turn-render.ts written again here: an environment's turn (the messages
between two assistant messages, or after the last one) is the text the template puts after a
probe assistant turn's end-of-turn string when the probe (a user turn, an assistant turn) is
followed by those messages and the generation prompt; the probe's user turn rendered alone
must be a prefix of that render.

For each case, a JSON object {"messages", "end_of_turn", "chat_template"?, "tools"?,
"variables"?}, it prints:
  env_turns         [{text, ids}] for each environment turn, in order
  incremental_ids   the prompt's ids (the messages before the first assistant message, with the
                    generation prompt), then for each assistant message the ids of its content
                    and the end-of-turn id, then the next environment turn's ids
  full_text, full_ids  the whole conversation rendered at once (with the generation prompt
                    when it ends with the environment's turn)
test/unit/agent-turn-render.test.ts compares moerl's episodes with these.

Usage: python3 turn_reference.py TOKENIZER_DIR CASES_JSON   (prints a JSON array)
"""
import json
import sys

from transformers import AutoTokenizer

PROBE_USER = {"role": "user", "content": "moerl probe: the question"}
PROBE_ASSISTANT = {"role": "assistant", "content": "moerl probe: the answer"}


def env_turn_text(render, messages, end_of_turn):
    context = render([PROBE_USER], False)
    full = render([PROBE_USER, PROBE_ASSISTANT, *messages], True)
    if not full.startswith(context):
        raise ValueError("the probe's user turn is not a prefix")
    turn_end = PROBE_ASSISTANT["content"] + end_of_turn
    at = full.find(turn_end, len(context))
    if at < 0:
        raise ValueError(f"no {end_of_turn!r} after the probe's answer")
    return full[at + len(turn_end) :]


def split_turns(messages):
    """(prompt messages, [(assistant message, environment messages after it)])."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    turns = []
    for m in messages[first:]:
        if m["role"] == "assistant":
            turns.append((m, []))
        else:
            turns[-1][1].append(m)
    return messages[:first], turns


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
    with open(sys.argv[2], encoding="utf-8") as f:
        cases = json.load(f)

    def encode(text):
        return tokenizer.encode(text, add_special_tokens=False)

    results = []
    for case in cases:
        kwargs = dict(chat_template=case.get("chat_template"), tools=case.get("tools"))
        kwargs.update(case.get("variables", {}))

        def render(messages, generation, tokenize=False):
            return tokenizer.apply_chat_template(
                messages,
                add_generation_prompt=generation,
                tokenize=tokenize,
                **({"return_dict": False} if tokenize else {}),
                **kwargs,
            )

        end_of_turn = case["end_of_turn"]
        end_of_turn_id = tokenizer.convert_tokens_to_ids(end_of_turn)
        prompt, turns = split_turns(case["messages"])
        ids = list(render(prompt, True, tokenize=True))
        env_turns = []
        for assistant, env in turns:
            ids += encode(assistant["content"]) + [end_of_turn_id]
            if env:
                text = env_turn_text(render, env, end_of_turn)
                env_turns.append({"text": text, "ids": encode(text)})
                ids += env_turns[-1]["ids"]
        ends_with_env = case["messages"][-1]["role"] != "assistant"
        results.append(
            {
                "env_turns": env_turns,
                "incremental_ids": ids,
                "full_text": render(case["messages"], ends_with_env),
                "full_ids": list(render(case["messages"], ends_with_env, tokenize=True)),
            }
        )
    print(json.dumps(results, ensure_ascii=False))


if __name__ == "__main__":
    main()
