// moerl's Hugging Face tokenizer and chat template (activities/models/tokenizer.ts) against the
// Python libraries, on the test tokenizer of test/reference/make_tokenizer.py: token ids and
// decoded text equal the tokenizers library's over a few thousand multilingual texts
// (test/reference/corpus.py), and rendered prompts equal transformers' apply_chat_template.
// Bad directories are refused with the file and the fault named (no Python needed there).
import assert from 'node:assert/strict';
import { cpSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { badInputErrorType } from '../../activities/types.js';
import type { ChatMessage } from '../../activities/models/chat-template.js';
import { loadTokenizer, type HfTokenizer } from '../../activities/models/tokenizer.js';
import { TokenizerFileError } from '../../activities/models/tokenizer-errors.js';
import { pythonReference } from '../support/python-reference.js';
import { chatCases, mixtralStyleTemplate } from '../fixtures/chat-cases.js';

const work = mkdtempSync(join(tmpdir(), 'moerl-hf-tokenizer-'));
after(() => rmSync(work, { recursive: true, force: true }));
const pyref = pythonReference();

interface ReferenceEncoding {
  ids: number[];
  ids_with_special: number[];
  decoded: string;
  decoded_skip_special: string;
}
interface ReferenceChat {
  prompt: string;
  generation_prompt: string;
  generation_ids: number[];
}

describe('HF tokenizer against the Python tokenizers library and transformers', { skip: pyref.skip }, () => {
  const dir = join(work, 'tokenizer');
  let tokenizer: HfTokenizer;
  // The cases with a template of their own: a copy of the directory with chat_template.jinja.
  const templated = new Map<string, HfTokenizer>();
  before(async () => {
    await pyref.run('make_tokenizer.py', [dir, '--vocab-size', '4096']);
    // Qwen's instruct models stop on <|im_end|> (the tokenizer's eos) and <|endoftext|>.
    writeFileSync(join(dir, 'generation_config.json'), JSON.stringify({ eos_token_id: [4095, 4093] }));
    tokenizer = await loadTokenizer(dir);
    for (const c of chatCases) {
      if (c.chat_template === undefined || templated.has(c.chat_template)) continue;
      const copy = join(work, `template-${templated.size}`);
      cpSync(dir, copy, { recursive: true });
      writeFileSync(join(copy, 'chat_template.jinja'), c.chat_template);
      templated.set(c.chat_template, await loadTokenizer(copy));
    }
  });

  it('token ids and decoded text equal the tokenizers library on 3,000+ multilingual texts', async () => {
    const texts = JSON.parse(await pyref.run('corpus.py', ['--seed', '1', '--count', '3000'])) as string[];
    const textsFile = join(work, 'texts.json');
    writeFileSync(textsFile, JSON.stringify(texts));
    const reference = JSON.parse(await pyref.run('tokenizer_reference.py', [dir, textsFile])) as {
      vocab_size: number;
      encodings: ReferenceEncoding[];
    };
    assert.equal(reference.encodings.length, texts.length);
    assert.equal(tokenizer.vocabSize, reference.vocab_size);
    const nonAscii = texts.filter((t) => [...t].some((ch) => ch.codePointAt(0)! > 0x7f)).length;
    assert.ok(nonAscii > 2000, `only ${nonAscii} texts have non-ASCII characters`);
    let tokens = 0;
    texts.forEach((text, i) => {
      const want = reference.encodings[i];
      const what = `text ${i} ${JSON.stringify(text.slice(0, 80))}`;
      assert.ok(want, what);
      const ids = tokenizer.encode(text);
      assert.deepEqual(ids, want.ids, what);
      assert.deepEqual(tokenizer.encode(text, { addSpecialTokens: true }), want.ids_with_special, what);
      assert.equal(tokenizer.decode(ids), want.decoded, what);
      assert.equal(tokenizer.decode(ids, { skipSpecialTokens: true }), want.decoded_skip_special, what);
      tokens += ids.length;
    });
    assert.ok(tokens > 50_000, `only ${tokens} tokens compared`);
  });

  it('rendered chats equal apply_chat_template, with and without the generation prompt, and so do their ids', async () => {
    const casesFile = join(work, 'chats.json');
    writeFileSync(casesFile, JSON.stringify(chatCases));
    const reference = JSON.parse(await pyref.run('chat_reference.py', [dir, casesFile])) as ReferenceChat[];
    assert.equal(reference.length, chatCases.length);
    chatCases.forEach((c, i) => {
      const what = `chat ${i} (${c.name})`;
      const tok = c.chat_template === undefined ? tokenizer : templated.get(c.chat_template);
      assert.ok(tok, what);
      const render = (addGenerationPrompt: boolean) =>
        tok.renderChat(c.messages, {
          addGenerationPrompt,
          variables: c.variables,
          tools: c.tools,
        });
      const want = reference[i];
      assert.ok(want, what);
      assert.equal(render(false).text, want.prompt, what);
      const generation = render(true);
      assert.equal(generation.text, want.generation_prompt, what);
      assert.deepEqual(generation.ids, want.generation_ids, what);
    });
  });

  it('eosTokenIds: every eos_token_id of generation_config.json (a list or an int) plus the eos token', async () => {
    assert.deepEqual(tokenizer.eosTokenIds, [4093, 4095]);
    assert.equal(tokenizer.tokenId('<|im_end|>'), 4095);
    assert.equal(
      tokenizer.eosTokenId,
      4095,
      "the tokenizer's own eos_token ends the completions moerl writes",
    );
    const single = join(work, 'single-eos');
    cpSync(dir, single, { recursive: true });
    writeFileSync(join(single, 'generation_config.json'), JSON.stringify({ eos_token_id: 4093 }));
    assert.deepEqual((await loadTokenizer(single)).eosTokenIds, [4093, 4095]);
    rmSync(join(single, 'generation_config.json'));
    assert.deepEqual((await loadTokenizer(single)).eosTokenIds, [4095]);
  });

  it('a template that raises (roles out of turn) fails with its message', () => {
    const strict = templated.get(mixtralStyleTemplate);
    assert.ok(strict);
    const messages: ChatMessage[] = [
      { role: 'user', content: 'a' },
      { role: 'user', content: 'b' },
    ];
    assert.throws(
      () => strict.renderChat(messages),
      (err: unknown) => err instanceof TokenizerFileError && /roles must alternate/.test(err.message),
    );
  });

  it('decode: an empty list is empty text; an id outside the vocabulary is refused', () => {
    assert.equal(tokenizer.decode([]), '');
    assert.throws(() => tokenizer.decode([4096]), /token id 4096 is outside the vocabulary .*\(0\.\.4095\)/);
    assert.throws(() => tokenizer.decode([-1]), /token id -1/);
  });
});

// ---------------------------------------------------------------------------------------------
// bad directories: a hand-written tokenizer.json of three tokens is enough

const tinyTokenizer = {
  version: '1.0',
  added_tokens: [{ id: 3, content: '</s>', special: true, normalized: false, lstrip: false, rstrip: false }],
  normalizer: null,
  pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: true },
  post_processor: null,
  decoder: { type: 'ByteLevel' },
  model: { type: 'BPE', vocab: { a: 0, b: 1, ab: 2 }, merges: ['a b'] },
};
const tinyConfig = { eos_token: '</s>', chat_template: '{% for m in messages %}{{ m.content }}{% endfor %}' };

let dirs = 0;
function badDir(files: Record<string, unknown>): string {
  const dir = join(work, `bad-${dirs++}`);
  mkdirSync(dir);
  const all: Record<string, unknown> = {
    'tokenizer.json': tinyTokenizer,
    'tokenizer_config.json': tinyConfig,
    ...files,
  };
  for (const [name, content] of Object.entries(all)) {
    if (content === undefined) continue;
    writeFileSync(join(dir, name), typeof content === 'string' ? content : JSON.stringify(content));
  }
  return dir;
}

async function assertRefused(dir: string, file: string, detail: RegExp): Promise<void> {
  await assert.rejects(loadTokenizer(dir), (err: unknown) => {
    assert.ok(err instanceof TokenizerFileError, `expected TokenizerFileError, got ${String(err)}`);
    assert.equal(err.file, join(dir, file));
    assert.equal(err.type, badInputErrorType);
    assert.equal(err.nonRetryable, true);
    assert.ok(err.message.startsWith(`${join(dir, file)}: `), err.message);
    assert.match(err.detail, detail);
    return true;
  });
}

describe('HF tokenizer: bad directories name the file and the fault', () => {
  it('the hand-written directory itself loads', async () => {
    const tok = await loadTokenizer(badDir({}));
    assert.deepEqual(tok.encode('ab'), [2]);
    assert.deepEqual(tok.eosTokenIds, [3]);
    assert.equal(tok.vocabSize, 4);
    assert.equal(tok.renderChat([{ role: 'user', content: 'ba' }]).text, 'ba');
  });

  it('missing tokenizer.json', async () => {
    await assertRefused(badDir({ 'tokenizer.json': undefined }), 'tokenizer.json', /^missing/);
  });

  it('tokenizer.json that is not JSON, or has no model', async () => {
    await assertRefused(badDir({ 'tokenizer.json': '{"model": ' }), 'tokenizer.json', /^not valid JSON/);
    await assertRefused(
      badDir({ 'tokenizer.json': { version: '1.0' } }),
      'tokenizer.json',
      /no "model" object/,
    );
  });

  it('unknown tokenizer model type', async () => {
    const tokenizerJson = { ...tinyTokenizer, model: { ...tinyTokenizer.model, type: 'SentencePieceBPE' } };
    await assertRefused(
      badDir({ 'tokenizer.json': tokenizerJson }),
      'tokenizer.json',
      /unknown tokenizer model type "SentencePieceBPE" \(supported: BPE, Unigram, WordPiece\)/,
    );
  });

  it('a component the library does not know', async () => {
    const tokenizerJson = { ...tinyTokenizer, normalizer: { type: 'Shout' } };
    await assertRefused(
      badDir({ 'tokenizer.json': tokenizerJson }),
      'tokenizer.json',
      /Unknown Normalizer type: Shout/,
    );
  });

  it('missing tokenizer_config.json', async () => {
    await assertRefused(badDir({ 'tokenizer_config.json': undefined }), 'tokenizer_config.json', /^missing/);
  });

  it('no chat_template', async () => {
    const { chat_template: _, ...config } = tinyConfig;
    await assertRefused(
      badDir({ 'tokenizer_config.json': config }),
      'tokenizer_config.json',
      /^no chat_template/,
    );
  });

  it('a chat_template that does not parse, in tokenizer_config.json or chat_template.jinja', async () => {
    const config = { ...tinyConfig, chat_template: '{% for m in messages %}{{ m.content }}' };
    await assertRefused(
      badDir({ 'tokenizer_config.json': config }),
      'tokenizer_config.json',
      /does not parse/,
    );
    await assertRefused(
      badDir({ 'chat_template.jinja': '{{ messages[0 }}' }),
      'chat_template.jinja',
      /does not parse/,
    );
  });

  it('chat_template.jinja wins over tokenizer_config.json', async () => {
    const tok = await loadTokenizer(badDir({ 'chat_template.jinja': '[{{ messages | length }}]' }));
    assert.equal(tok.renderChat([{ role: 'user', content: 'x' }]).text, '[1]');
  });

  it('an eos_token missing from the vocabulary, or no eos at all', async () => {
    await assertRefused(
      badDir({ 'tokenizer_config.json': { ...tinyConfig, eos_token: '<eos>' } }),
      'tokenizer_config.json',
      /eos_token "<eos>" is not in the vocabulary/,
    );
    const { eos_token: _, ...config } = tinyConfig;
    await assertRefused(badDir({ 'tokenizer_config.json': config }), 'tokenizer_config.json', /no eos_token/);
  });

  it('generation_config.json with a bad eos_token_id', async () => {
    const file = 'generation_config.json';
    await assertRefused(badDir({ [file]: { eos_token_id: 'x' } }), file, /eos_token_id must be a token id/);
    await assertRefused(
      badDir({ [file]: { eos_token_id: [3, 1.5] } }),
      file,
      /eos_token_id must be a token id/,
    );
    await assertRefused(
      badDir({ [file]: { eos_token_id: 9 } }),
      file,
      /eos_token_id 9 is outside the vocabulary/,
    );
  });

  it("config.json's eos_token_id counts when there is no generation_config.json", async () => {
    const tok = await loadTokenizer(badDir({ 'config.json': { eos_token_id: 1 } }));
    assert.deepEqual(tok.eosTokenIds, [1, 3]);
  });
});
