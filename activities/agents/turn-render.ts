// The environment's turn of a multi-turn (agentic) episode, as text and as token ids.
//
// An episode is token in, token out: the prompt's ids, the policy's ids (ending with its
// end-of-turn token, <|im_end|> for ChatML), the environment's turn, the policy's ids again, and
// so on; decoded text is never tokenized again. Rendering the whole history again at each turn
// would not give those ids back, because chat templates are not prefix-stable: Qwen3's drops the
// reasoning of the assistant turns before the last user message, and gives the last assistant
// turn an empty <think> block it does not have once more turns follow. So the environment's turn
// is rendered on its own, as the text that follows the policy's end-of-turn token.
//
// The rule: render a fixed probe conversation (one user turn, one assistant turn, with the
// episode's tools and template variables), then the environment's messages and the generation
// prompt. The probe's user turn rendered alone must be a prefix of that render (otherwise the
// environment's messages change what comes before them, and nothing can be appended), and the
// probe assistant's content followed by the end-of-turn string must come after it; the
// environment's turn is everything after that end-of-turn string. The probe's assistant turn is
// not compared with its render as the last message: that is where Qwen3 adds the empty <think>.
import { join } from 'node:path';
import type { ChatMessage, RenderChatOptions } from '../models/chat-template.js';
import type { HfTokenizer } from '../models/tokenizer.js';
import { TokenizerFileError } from '../models/tokenizer-errors.js';

/** A chat template and the file it was read from (named in errors). */
export interface TurnTemplate {
  render(messages: ChatMessage[], opts: RenderChatOptions): string;
  file: string;
}

export interface EnvironmentTurnOptions {
  /** The text the policy's turn ends with: its end-of-turn token, e.g. '<|im_end|>'. */
  endOfTurn: string;
  /** The episode's tool schemas, as its prompt was rendered with. */
  tools?: readonly unknown[];
  /** The episode's other template variables (enable_thinking…), as its prompt was rendered with. */
  variables?: Record<string, unknown>;
}

// Words no template writes itself, so that finding them finds the probe.
const probeUser: ChatMessage = { role: 'user', content: 'moerl probe: the question' };
const probeAssistant: ChatMessage = { role: 'assistant', content: 'moerl probe: the answer' };

/**
 * The text of the environment's turn (its tool or user messages, then the opening of the next
 * assistant turn), to append right after the policy's end-of-turn token. Throws
 * TokenizerFileError, naming the template's file, when the template gives no such text.
 */
export function environmentTurnText(
  template: TurnTemplate,
  messages: ChatMessage[],
  opts: EnvironmentTurnOptions,
): string {
  const refuse = (detail: string) => new TokenizerFileError(template.file, detail);
  if (opts.endOfTurn === '') throw new RangeError('environmentTurnText: endOfTurn is empty');
  const assistant = messages.findIndex((m) => m.role === 'assistant');
  if (assistant >= 0) {
    // An assistant message here would put text in the policy's mouth that it did not generate.
    throw new RangeError(
      `environmentTurnText: message ${assistant} of the environment's turn is an assistant message; only the policy writes those`,
    );
  }
  const render = { tools: opts.tools, variables: opts.variables };
  const context = template.render([probeUser], render);
  const full = template.render([probeUser, probeAssistant, ...messages], {
    ...render,
    addGenerationPrompt: true,
  });
  if (!full.startsWith(context)) {
    throw refuse(
      'chat_template renders the turns before an assistant turn differently once more messages follow it, ' +
        "so the environment's turn cannot be appended to an episode",
    );
  }
  const turnEnd = probeAssistant.content + opts.endOfTurn;
  const at = full.indexOf(turnEnd, context.length);
  if (at < 0) {
    throw refuse(
      `chat_template does not end an assistant turn's content with the end-of-turn ${JSON.stringify(opts.endOfTurn)}`,
    );
  }
  const turn = full.slice(at + turnEnd.length);
  if (turn.includes(probeUser.content) || turn.includes(probeAssistant.content)) {
    throw refuse(
      "chat_template repeats earlier turns after an assistant turn, so the environment's turn is not text of its own",
    );
  }
  return turn;
}

/**
 * The token ids of the environment's turn, to append after the policy's end-of-turn id: the
 * text of environmentTurnText with the tokenizer's own template, encoded without special tokens
 * added (those the template writes, <|im_start|>, get their ids). endOfTurn defaults to the
 * tokenizer's eos token (<|im_end|> for Qwen3). It must be one token: the ids of the text after
 * a special token do not depend on the ids before it.
 */
export function environmentTurnIds(
  tokenizer: HfTokenizer,
  messages: ChatMessage[],
  opts: Partial<EnvironmentTurnOptions> = {},
): number[] {
  const endOfTurn = opts.endOfTurn ?? tokenizer.decode([tokenizer.eosTokenId]);
  if (tokenizer.tokenId(endOfTurn) === undefined) {
    throw new TokenizerFileError(
      join(tokenizer.dir, 'tokenizer.json'),
      `the end-of-turn ${JSON.stringify(endOfTurn)} is not one token of the vocabulary`,
    );
  }
  return tokenizer.encode(environmentTurnText(tokenizer.chatTemplate, messages, { ...opts, endOfTurn }));
}

/**
 * The text of an assistant turn of a demonstration (an SFT row's turns after the prompt), as the
 * policy would have generated it: what the chat template renders for the message after the
 * generation prompt, up to and including the end-of-turn string. Its tool calls are written as
 * the template writes them (Qwen3's `<tool_call>` lines). The episode's rule, for the policy's
 * side: an SFT example's ids are what a sampled episode's would be.
 */
export function policyTurnText(
  template: TurnTemplate,
  message: ChatMessage,
  opts: EnvironmentTurnOptions,
): string {
  const refuse = (detail: string) => new TokenizerFileError(template.file, detail);
  if (message.role !== 'assistant')
    throw new RangeError(`policyTurnText: a ${message.role} message is not the policy's`);
  const render = { tools: opts.tools, variables: opts.variables };
  const prompt = template.render([probeUser], { ...render, addGenerationPrompt: true });
  const full = template.render([probeUser, message], render);
  if (!full.startsWith(prompt))
    throw refuse(
      'chat_template renders an assistant turn without the opening its generation prompt gives it, ' +
        "so a demonstration's turn is not what the policy would generate",
    );
  const end = full.indexOf(opts.endOfTurn, prompt.length);
  if (end < 0)
    throw refuse(
      `chat_template does not end an assistant turn with the end-of-turn ${JSON.stringify(opts.endOfTurn)}`,
    );
  return full.slice(prompt.length, end + opts.endOfTurn.length);
}

/** The ids of a demonstration's turns after its prompt, and their loss mask (1 on the assistant's). */
export function demonstrationIds(
  tokenizer: HfTokenizer,
  turns: readonly ChatMessage[],
  opts: Partial<EnvironmentTurnOptions> = {},
): { tokens: number[]; lossMask: number[] } {
  const endOfTurn = opts.endOfTurn ?? tokenizer.decode([tokenizer.eosTokenId]);
  const full = { ...opts, endOfTurn };
  const tokens: number[] = [];
  const lossMask: number[] = [];
  for (let i = 0; i < turns.length;) {
    if (turns[i]!.role === 'assistant') {
      const ids = tokenizer.encode(policyTurnText(tokenizer.chatTemplate, turns[i]!, full));
      tokens.push(...ids);
      lossMask.push(...ids.map(() => 1));
      i++;
      continue;
    }
    let j = i;
    while (j < turns.length && turns[j]!.role !== 'assistant') j++;
    const ids = environmentTurnIds(tokenizer, turns.slice(i, j), full);
    tokens.push(...ids);
    lossMask.push(...ids.map(() => 0));
    i = j;
  }
  return { tokens, lossMask };
}
