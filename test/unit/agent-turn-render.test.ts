// The environment's turn of a multi-turn episode (activities/agents/turn-render.ts) against the
// same rule computed with transformers' apply_chat_template (test/reference/turn_reference.py),
// on the test tokenizer of test/reference/make_tokenizer.py. Episodes are built turn by turn as
// a rollout builds them: the prompt's ids, then per assistant message the ids of its content and
// the end-of-turn id, then the environment turn's ids. With ChatML they are the ids of the whole
// conversation rendered at once; with the Qwen3-style template they keep the reasoning that the
// whole render drops. The error paths need no Python.
import assert from 'node:assert/strict';
import { cpSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import {
  demonstrationIds,
  environmentTurnIds,
  policyTurnText,
  environmentTurnText,
  type TurnTemplate,
} from '../../activities/agents/turn-render.js';
import { ChatTemplate, type ChatMessage } from '../../activities/models/chat-template.js';
import { loadTokenizer, type HfTokenizer } from '../../activities/models/tokenizer.js';
import { TokenizerFileError } from '../../activities/models/tokenizer-errors.js';
import { pythonReference } from '../support/python-reference.js';
import {
  agentCases,
  agentTools,
  chatmlAgentCases,
  chatmlToolsTemplate,
  qwen3ReasoningCase,
  type AgentCase,
} from '../fixtures/agent-chat-cases.js';
import { mixtralStyleTemplate } from '../fixtures/chat-cases.js';

const work = mkdtempSync(join(tmpdir(), 'moerl-agent-turn-'));
after(() => rmSync(work, { recursive: true, force: true }));
const pyref = pythonReference();

interface ReferenceEpisode {
  env_turns: Array<{ text: string; ids: number[] }>;
  incremental_ids: number[];
  full_text: string;
  full_ids: number[];
}

interface Episode {
  ids: number[];
  envTurns: Array<{ text: string; ids: number[] }>;
  promptLength: number;
}

/** The episode as a rollout builds it: token in, token out, nothing decoded and encoded again. */
function buildEpisode(tok: HfTokenizer, c: AgentCase): Episode {
  const opts = { tools: c.tools, variables: c.variables, endOfTurn: c.end_of_turn };
  const endOfTurnId = tok.tokenId(c.end_of_turn);
  assert.ok(endOfTurnId !== undefined);
  const first = c.messages.findIndex((m) => m.role === 'assistant');
  const ids = tok.renderChat(c.messages.slice(0, first), { ...opts, addGenerationPrompt: true }).ids;
  const promptLength = ids.length;
  const envTurns: Episode['envTurns'] = [];
  let env: ChatMessage[] = [];
  const endEnvTurn = () => {
    if (env.length === 0) return;
    envTurns.push({
      text: environmentTurnText(tok.chatTemplate, env, opts),
      ids: environmentTurnIds(tok, env, opts),
    });
    ids.push(...envTurns[envTurns.length - 1]!.ids);
    env = [];
  };
  for (const m of c.messages.slice(first)) {
    if (m.role !== 'assistant') {
      env.push(m);
      continue;
    }
    endEnvTurn();
    // What the policy generated: its text's ids (the sampler's, in a rollout), then end-of-turn.
    // The fixtures' replies start with no whitespace, so these are the ids the whole render
    // gives them after 'assistant\n' too (a leading '\n' would merge with that one).
    ids.push(...tok.encode(m.content), endOfTurnId);
  }
  endEnvTurn();
  return { ids, envTurns, promptLength };
}

describe('environment turns against transformers', { skip: pyref.skip }, () => {
  const dir = join(work, 'tokenizer');
  const tokenizers = new Map<string | undefined, HfTokenizer>();
  let reference: ReferenceEpisode[];
  const tokenizerFor = (c: AgentCase) => {
    const tok = tokenizers.get(c.chat_template);
    assert.ok(tok, c.name);
    return tok;
  };
  const referenceFor = (c: AgentCase) => {
    const want = reference[agentCases.indexOf(c)];
    assert.ok(want, c.name);
    return want;
  };

  before(async () => {
    await pyref.run('make_tokenizer.py', [dir, '--vocab-size', '4096']);
    tokenizers.set(undefined, await loadTokenizer(dir));
    for (const c of agentCases) {
      if (c.chat_template === undefined || tokenizers.has(c.chat_template)) continue;
      const copy = join(work, `template-${tokenizers.size}`);
      cpSync(dir, copy, { recursive: true });
      writeFileSync(join(copy, 'chat_template.jinja'), c.chat_template);
      tokenizers.set(c.chat_template, await loadTokenizer(copy));
    }
    const casesFile = join(work, 'cases.json');
    writeFileSync(casesFile, JSON.stringify(agentCases));
    reference = JSON.parse(await pyref.run('turn_reference.py', [dir, casesFile])) as ReferenceEpisode[];
    assert.equal(reference.length, agentCases.length);
  });

  it('ChatML with tools: the episode built turn by turn has the ids of the whole conversation', () => {
    for (const c of chatmlAgentCases) {
      const tok = tokenizerFor(c);
      const want = referenceFor(c);
      const episode = buildEpisode(tok, c);
      assert.deepEqual(episode.envTurns, want.env_turns, c.name);
      assert.deepEqual(episode.ids, want.incremental_ids, c.name);
      const endsWithEnv = c.messages[c.messages.length - 1]!.role !== 'assistant';
      const full = tok.renderChat(c.messages, { tools: c.tools, addGenerationPrompt: endsWithEnv });
      assert.equal(full.text, want.full_text, c.name);
      assert.deepEqual(full.ids, want.full_ids, c.name);
      if (endsWithEnv) {
        assert.deepEqual(episode.ids, full.ids, c.name);
      } else {
        // The template writes a newline after the last <|im_end|>; the policy stopped before it.
        assert.deepEqual(full.ids, [...episode.ids, ...tok.encode('\n')], c.name);
      }
    }
  });

  it('ChatML with tools: the tools are in the prompt and a tool turn is what follows <|im_end|>', () => {
    const [c] = chatmlAgentCases;
    assert.ok(c);
    const episode = buildEpisode(tokenizerFor(c), c);
    assert.match(tokenizerFor(c).decode(episode.ids.slice(0, episode.promptLength)), /"name": "reverse"/);
    assert.deepEqual(
      episode.envTurns.map((t) => t.text),
      [
        '\n<|im_start|>tool\n<tool_response>\nété\n</tool_response><|im_end|>\n<|im_start|>assistant\n',
        '\n<|im_start|>tool\n<tool_response>\n862\n</tool_response>\n<tool_response>\nnote: 日本語 OK 🙂\nsecond line\n</tool_response><|im_end|>\n<|im_start|>assistant\n',
      ],
    );
  });

  it('Qwen3-style: the episode keeps the earlier reasoning the whole render drops, as transformers builds it', () => {
    const c = qwen3ReasoningCase;
    const tok = tokenizerFor(c);
    const want = referenceFor(c);
    const episode = buildEpisode(tok, c);
    assert.deepEqual(episode.envTurns, want.env_turns);
    assert.deepEqual(episode.ids, want.incremental_ids);
    const full = tok.renderChat(c.messages, { tools: c.tools });
    assert.equal(full.text, want.full_text);
    assert.deepEqual(full.ids, want.full_ids);

    // The same up to the first assistant turn, which the whole render gives without its reasoning.
    assert.notDeepEqual(episode.ids.slice(0, full.ids.length), full.ids);
    let same = 0;
    while (episode.ids[same] === full.ids[same]) same++;
    assert.equal(same, episode.promptLength);
    const text = tok.decode(episode.ids);
    for (const reasoning of ['2 and 2 make 4.', '3 and 3 make 6. 🧮', 'Done.']) {
      assert.ok(text.includes(reasoning), reasoning);
    }
    assert.ok(!full.text.includes('2 and 2 make 4.') && !full.text.includes('3 and 3 make 6.'));
    assert.ok(full.text.includes('Done.'), 'the reasoning after the last user message stays');
    // The environment's turns are plain user turns opening the next assistant turn.
    assert.equal(
      episode.envTurns[0]?.text,
      '\n<|im_start|>user\nChecked: correct. And 3+3?<|im_end|>\n<|im_start|>assistant\n',
    );
  });
  it("a demonstration (an SFT row's turns after its prompt) has the ids a sampled episode would, masked the same way", () => {
    for (const c of [...chatmlAgentCases, qwen3ReasoningCase]) {
      if (c.messages.at(-1)!.role !== 'assistant') continue;
      const tok = tokenizerFor(c);
      const first = c.messages.findIndex((m) => m.role === 'assistant');
      const prompt = tok.renderChat(c.messages.slice(0, first), {
        addGenerationPrompt: true,
        ...(c.tools ? { tools: c.tools } : {}),
      }).ids;
      const turns = c.messages.slice(first);
      const demo = demonstrationIds(tok, turns, c.tools ? { tools: c.tools } : {});
      // transformers' turn-by-turn ids of the same conversation (test/reference/turn_reference.py).
      assert.deepEqual([...prompt, ...demo.tokens], referenceFor(c).incremental_ids, c.name);
      // 1 exactly on the assistant turns' ids, each as the template writes it after the prompt.
      const trained = tok.decode(demo.tokens.filter((_, i) => demo.lossMask[i] === 1));
      const policyTurns = turns
        .filter((t) => t.role === 'assistant')
        .map((t) =>
          policyTurnText(tok.chatTemplate, t, {
            endOfTurn: '<|im_end|>',
            ...(c.tools ? { tools: c.tools } : {}),
          }),
        );
      assert.equal(trained, policyTurns.join(''), c.name);
      assert.ok(
        policyTurns.every((t, i) => t.includes(turns.filter((m) => m.role === 'assistant')[i]!.content)),
      );
    }
  });

  it("environmentTurnIds: the tokenizer's eos by default; errors name the tokenizer's files", async () => {
    const tok = tokenizerFor(chatmlAgentCases[0]!);
    const turn = environmentTurnIds(tok, [{ role: 'tool', content: '42' }]);
    assert.deepEqual(
      turn,
      environmentTurnIds(tok, [{ role: 'tool', content: '42' }], { endOfTurn: '<|im_end|>' }),
    );
    assert.equal(tok.decode(turn), environmentTurnText(chatml, toolResult, { endOfTurn }));
    const own = tokenizerFor(chatmlAgentCases[3]!);
    assertRefused(
      () => environmentTurnIds(own, toolResult, { endOfTurn: '<|endoftext|>' }),
      /does not end an assistant turn's content/,
      join(dir, 'tokenizer_config.json'),
    );
    assertRefused(
      () => environmentTurnIds(tok, toolResult, { endOfTurn: '<|im_end|>' + '<|im_end|>' }),
      /is not one token of the vocabulary/,
      join(tok.dir, 'tokenizer.json'),
    );
    const copy = join(work, 'no-end-of-turn');
    cpSync(dir, copy, { recursive: true });
    writeFileSync(join(copy, 'chat_template.jinja'), '{% for m in messages %}{{ m.content }}{% endfor %}');
    const noEndOfTurn = await loadTokenizer(copy);
    assertRefused(
      () => environmentTurnIds(noEndOfTurn, toolResult),
      /does not end/,
      join(copy, 'chat_template.jinja'),
    );
  });
});

// ---------------------------------------------------------------------------------------------
// the rule on templates written here, and its errors: no Python needed

const file = '/models/m/chat_template.jinja';
function template(source: string): TurnTemplate {
  const chat = new ChatTemplate(source, file, { eos_token: '<|im_end|>' });
  return { render: (messages, opts) => chat.render(messages, opts), file };
}
const chatml = template(chatmlToolsTemplate);
const endOfTurn = '<|im_end|>';
const toolResult: ChatMessage[] = [{ role: 'tool', content: '42' }];

function assertRefused(run: () => unknown, detail: RegExp, where = file): void {
  assert.throws(run, (err: unknown) => {
    assert.ok(err instanceof TokenizerFileError, `expected TokenizerFileError, got ${String(err)}`);
    assert.equal(err.file, where);
    assert.match(err.detail, detail);
    return true;
  });
}

describe('environment turns: the rule and its errors', () => {
  it('ChatML: the tool turn and the next assistant opening, the same with or without tools', () => {
    const turn =
      '\n<|im_start|>tool\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n';
    assert.equal(environmentTurnText(chatml, toolResult, { endOfTurn, tools: agentTools }), turn);
    assert.equal(environmentTurnText(chatml, toolResult, { endOfTurn }), turn);
  });

  it('a template that renders the last assistant turn differently (an empty <think>, as Qwen3) still works', () => {
    const lastThinks = chatmlToolsTemplate.replace(
      "{{- '<|im_start|>' + message.role + '\\n' + message.content",
      "{{- '<|im_start|>' + message.role + '\\n' + ('<think>\\n\\n</think>\\n\\n' if message.role == 'assistant' and loop.last else '') + message.content",
    );
    assert.notEqual(lastThinks, chatmlToolsTemplate);
    const probe: ChatMessage[] = [
      { role: 'user', content: 'q' },
      { role: 'assistant', content: 'a' },
    ];
    assert.match(template(lastThinks).render(probe, {}), /<think>/);
    assert.equal(
      environmentTurnText(template(lastThinks), toolResult, { endOfTurn }),
      environmentTurnText(chatml, toolResult, { endOfTurn }),
    );
  });

  it('Mixtral-style: a turn ends with eos_token and has no generation prompt', () => {
    const mixtral = template(mixtralStyleTemplate);
    const user: ChatMessage[] = [{ role: 'user', content: 'Again?' }];
    assert.equal(environmentTurnText(mixtral, user, { endOfTurn }), ' [INST] Again? [/INST]');
    // Its template raises on a tool message; the error names the file.
    assertRefused(() => environmentTurnText(mixtral, toolResult, { endOfTurn }), /roles must alternate/);
  });

  it('refused: the environment messages change what comes before them', () => {
    const counting = template(`{{- messages | length }} messages\n${chatmlToolsTemplate}`);
    assertRefused(
      () => environmentTurnText(counting, toolResult, { endOfTurn }),
      /renders the turns before an assistant turn differently/,
    );
  });

  it('refused: the end-of-turn string does not follow the assistant content', () => {
    assertRefused(
      () => environmentTurnText(chatml, toolResult, { endOfTurn: '<|endoftext|>' }),
      /does not end an assistant turn's content with the end-of-turn "<\|endoftext\|>"/,
    );
    const noEnd = template(
      "{%- for m in messages %}{{- '<' + m.role + '>' + m.content }}{%- endfor %}" +
        "{%- if add_generation_prompt %}{{- '<assistant>' }}{%- endif %}",
    );
    assertRefused(() => environmentTurnText(noEnd, toolResult, { endOfTurn }), /does not end/);
  });

  it('refused: the environment turn repeats earlier turns', () => {
    const recap = template(
      `${chatmlToolsTemplate}{%- if add_generation_prompt %}{%- for m in messages %}{{- m.content }}{%- endfor %}{%- endif %}`,
    );
    assertRefused(() => environmentTurnText(recap, toolResult, { endOfTurn }), /repeats earlier turns/);
  });

  it('refused: an assistant message in the environment turn, an empty end-of-turn', () => {
    assert.throws(
      () => environmentTurnText(chatml, [...toolResult, { role: 'assistant', content: 'x' }], { endOfTurn }),
      /message 1 of the environment's turn is an assistant message/,
    );
    assert.throws(() => environmentTurnText(chatml, toolResult, { endOfTurn: '' }), /endOfTurn is empty/);
  });
});
