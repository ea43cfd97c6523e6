// A Hugging Face tokenizer directory on the TypeScript side: tokenizer.json encoded and decoded
// with @huggingface/tokenizers, the chat template of tokenizer_config.json (or
// chat_template.jinja) rendered with @huggingface/jinja (chat-template.ts), and the token ids
// that end a completion: every eos_token_id of generation_config.json plus the tokenizer's own
// eos token. Test models' tokenizers come from test/reference/make_tokenizer.py; the ids are
// checked against the Python tokenizers library and the prompts against transformers'
// apply_chat_template (test/unit/hf-tokenizer.test.ts).
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { Tokenizer } from '@huggingface/tokenizers';
import { ChatTemplate, type ChatMessage, type RenderChatOptions } from './chat-template.js';
import { TokenizerFileError } from './tokenizer-errors.js';

/** The tokenizer models tokenizer.json may name (`model.type`). */
export const tokenizerModelTypes = ['BPE', 'Unigram', 'WordPiece'] as const;

/** The special tokens transformers passes to a chat template when the tokenizer sets them. */
const templateTokenNames = [
  'bos_token',
  'eos_token',
  'unk_token',
  'sep_token',
  'pad_token',
  'cls_token',
  'mask_token',
] as const;

export interface EncodeOptions {
  /** Let the tokenizer's post-processor add its special tokens (a BOS). Default false: a
   * rendered chat prompt already holds every special token its template wants. */
  addSpecialTokens?: boolean;
}

export interface DecodeOptions {
  /** Leave out special tokens (<|im_end|>, <|endoftext|>…). Default false. */
  skipSpecialTokens?: boolean;
}

/**
 * The part of @huggingface/tokenizers' Tokenizer used here. Its published types import their
 * own files without extensions, which NodeNext resolution cannot follow, so they are named here.
 */
interface LibraryTokenizer {
  encode(text: string, opts: { add_special_tokens: boolean }): { ids: number[]; tokens: string[] };
  decode(
    ids: number[],
    opts: { skip_special_tokens: boolean; clean_up_tokenization_spaces: boolean },
  ): string;
  token_to_id(token: string): number | undefined;
  get_vocab(withAddedTokens: boolean): Map<string, number>;
}

export interface RenderedChat {
  text: string;
  ids: number[];
}

export class HfTokenizer {
  /** Number of token ids: the highest id + 1 (added tokens included). */
  readonly vocabSize: number;
  /** Ids that end a completion, ascending, each once. */
  readonly eosTokenIds: number[];

  constructor(
    /** The directory it was loaded from. */
    readonly dir: string,
    private readonly tokenizer: LibraryTokenizer,
    /** The model's chat template (an agentic episode renders its environment turns with it). */
    readonly chatTemplate: ChatTemplate,
    eosTokenIds: number[],
    private readonly cleanUpSpaces: boolean,
    /** The id a completion moerl writes ends with (an SFT example's): the tokenizer's own
     * eos_token, else the first eos_token_id of the generation config. */
    readonly eosTokenId: number,
  ) {
    this.vocabSize = vocabSizeOf(tokenizer);
    this.eosTokenIds = eosTokenIds;
  }

  encode(text: string, opts: EncodeOptions = {}): number[] {
    const { ids, tokens } = this.tokenizer.encode(text, {
      add_special_tokens: opts.addSpecialTokens ?? false,
    });
    const unknown = ids.findIndex((id) => id === undefined);
    if (unknown >= 0) {
      throw new TokenizerFileError(
        join(this.dir, 'tokenizer.json'),
        `token ${JSON.stringify(tokens[unknown])} has no id and the model has no unk_token`,
      );
    }
    return ids;
  }

  decode(ids: readonly number[], opts: DecodeOptions = {}): string {
    for (const id of ids) {
      if (!Number.isInteger(id) || id < 0 || id >= this.vocabSize) {
        throw new RangeError(
          `token id ${id} is outside the vocabulary of ${this.dir} (0..${this.vocabSize - 1})`,
        );
      }
    }
    // The library refuses an empty list; an empty completion is text too.
    if (ids.length === 0) return '';
    return this.tokenizer.decode([...ids], {
      skip_special_tokens: opts.skipSpecialTokens ?? false,
      clean_up_tokenization_spaces: this.cleanUpSpaces,
    });
  }

  /** The chat rendered with the model's own template, and its token ids. */
  renderChat(messages: ChatMessage[], opts: RenderChatOptions = {}): RenderedChat {
    const text = this.chatTemplate.render(messages, opts);
    return { text, ids: this.encode(text) };
  }

  /** The id of a token (special or not), or undefined when the vocabulary lacks it. */
  tokenId(token: string): number | undefined {
    return this.tokenizer.token_to_id(token);
  }
}

/**
 * Loads a Hugging Face tokenizer directory: tokenizer.json and tokenizer_config.json (both
 * needed; the chat template comes from chat_template.jinja when that file exists, as in
 * transformers), generation_config.json when present (else config.json's eos_token_id).
 * Throws TokenizerFileError naming the file and what is wrong with it.
 */
export async function loadTokenizer(dir: string): Promise<HfTokenizer> {
  const tokenizerFile = join(dir, 'tokenizer.json');
  const configFile = join(dir, 'tokenizer_config.json');
  const tokenizerJson = await readJsonObject(tokenizerFile, 'a Hugging Face tokenizer directory needs it');
  const config = await readJsonObject(configFile, 'it holds the chat template and the special tokens');

  const model = tokenizerJson.model;
  if (model === null || typeof model !== 'object' || Array.isArray(model)) {
    throw new TokenizerFileError(tokenizerFile, 'no "model" object');
  }
  const modelType = (model as Record<string, unknown>).type;
  if (!(tokenizerModelTypes as readonly unknown[]).includes(modelType)) {
    throw new TokenizerFileError(
      tokenizerFile,
      `unknown tokenizer model type ${JSON.stringify(modelType)} (supported: ${tokenizerModelTypes.join(', ')})`,
    );
  }
  let tokenizer: LibraryTokenizer;
  try {
    tokenizer = new Tokenizer({ added_tokens: [], ...tokenizerJson }, config);
  } catch (err) {
    throw new TokenizerFileError(
      tokenizerFile,
      `not a tokenizer this library reads: ${(err as Error).message}`,
      err,
    );
  }

  const specialTokens: Record<string, string> = {};
  for (const name of templateTokenNames) {
    const token = tokenContent(config[name], configFile, name);
    if (token !== undefined) specialTokens[name] = token;
  }
  const chatTemplate = new ChatTemplate(...(await chatTemplateSource(dir, config)), specialTokens);

  const eos = new Set<number>();
  const generation = await generationEosIds(dir);
  for (const id of generation?.ids ?? []) {
    if (id >= vocabSizeOf(tokenizer)) {
      throw new TokenizerFileError(
        generation?.file ?? dir,
        `eos_token_id ${id} is outside the vocabulary of tokenizer.json (0..${vocabSizeOf(tokenizer) - 1})`,
      );
    }
    eos.add(id);
  }
  let ownEos: number | undefined;
  if (specialTokens.eos_token !== undefined) {
    const id = tokenizer.token_to_id(specialTokens.eos_token);
    if (id === undefined) {
      throw new TokenizerFileError(
        configFile,
        `eos_token ${JSON.stringify(specialTokens.eos_token)} is not in the vocabulary of tokenizer.json`,
      );
    }
    eos.add(id);
    ownEos = id;
  }
  if (eos.size === 0) {
    throw new TokenizerFileError(
      configFile,
      'no eos_token, and no eos_token_id in generation_config.json or config.json: nothing would end a completion',
    );
  }
  const eosTokenIds = [...eos].sort((a, b) => a - b);
  return new HfTokenizer(
    dir,
    tokenizer,
    chatTemplate,
    eosTokenIds,
    config.clean_up_tokenization_spaces === true,
    ownEos ?? (generation?.ids[0] as number),
  );
}

async function readText(file: string, why: string): Promise<string | undefined> {
  try {
    return await readFile(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') {
      if (why === '') return undefined;
      throw new TokenizerFileError(file, `missing (${why})`, err);
    }
    throw new TokenizerFileError(file, `unreadable: ${(err as Error).message}`, err);
  }
}

/** The file's JSON object; undefined when `why` is '' and the file does not exist. */
async function readJsonObject(file: string, why: ''): Promise<Record<string, unknown> | undefined>;
async function readJsonObject(file: string, why: string): Promise<Record<string, unknown>>;
async function readJsonObject(file: string, why: string): Promise<Record<string, unknown> | undefined> {
  const text = await readText(file, why);
  if (text === undefined) return undefined;
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    throw new TokenizerFileError(file, `not valid JSON: ${(err as Error).message}`, err);
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw new TokenizerFileError(file, 'not a JSON object');
  }
  return value as Record<string, unknown>;
}

/** A special token as tokenizer_config.json writes it: a string, an AddedToken object or null. */
function tokenContent(value: unknown, file: string, name: string): string | undefined {
  if (value === undefined || value === null) return undefined;
  if (typeof value === 'string') return value;
  if (typeof value === 'object' && typeof (value as { content?: unknown }).content === 'string') {
    return (value as { content: string }).content;
  }
  throw new TokenizerFileError(
    file,
    `${name} must be a string or an object with "content", not ${JSON.stringify(value)}`,
  );
}

/** [template text, file it came from]. */
async function chatTemplateSource(dir: string, config: Record<string, unknown>): Promise<[string, string]> {
  const jinjaFile = join(dir, 'chat_template.jinja');
  const jinja = await readText(jinjaFile, '');
  if (jinja !== undefined) return [jinja, jinjaFile];
  const configFile = join(dir, 'tokenizer_config.json');
  const template = config.chat_template;
  if (typeof template === 'string') return [template, configFile];
  // Older files keep several named templates: [{ name, template }]; prompts use "default".
  if (Array.isArray(template)) {
    const named = template.find((t) => (t as { name?: unknown })?.name === 'default') as
      { template?: unknown } | undefined;
    if (typeof named?.template === 'string') return [named.template, configFile];
    throw new TokenizerFileError(configFile, 'chat_template lists named templates but none named "default"');
  }
  if (template === undefined || template === null) {
    throw new TokenizerFileError(
      configFile,
      "no chat_template (and no chat_template.jinja beside it): prompts are rendered with the model's own template",
    );
  }
  throw new TokenizerFileError(configFile, `chat_template must be a string, not ${JSON.stringify(template)}`);
}

/** generation_config.json's eos_token_id (an int or a list), else config.json's; undefined when neither says. */
async function generationEosIds(dir: string): Promise<{ file: string; ids: number[] } | undefined> {
  for (const name of ['generation_config.json', 'config.json']) {
    const file = join(dir, name);
    const config = await readJsonObject(file, '');
    if (config === undefined || config.eos_token_id === undefined || config.eos_token_id === null) continue;
    const value = config.eos_token_id;
    const ids = Array.isArray(value) ? value : [value];
    for (const id of ids) {
      if (!Number.isInteger(id) || (id as number) < 0) {
        throw new TokenizerFileError(
          file,
          `eos_token_id must be a token id or a list of them, not ${JSON.stringify(value)}`,
        );
      }
    }
    return { file, ids: ids as number[] };
  }
  return undefined;
}

/** The highest token id + 1, added tokens included. */
function vocabSizeOf(tokenizer: LibraryTokenizer): number {
  let highest = -1;
  for (const id of tokenizer.get_vocab(true).values()) highest = Math.max(highest, id);
  return highest + 1;
}
