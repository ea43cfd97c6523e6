// A model's chat template (the Jinja `chat_template` of a Hugging Face tokenizer) rendered with
// @huggingface/jinja the way transformers' apply_chat_template renders it: the same variables
// (messages, add_generation_prompt, tools, the special tokens the tokenizer sets) and the same
// environment (trim_blocks and lstrip_blocks; raise_exception and strftime_now are built in).
import { Template } from '@huggingface/jinja';
import { TokenizerFileError } from './tokenizer-errors.js';

/** One chat message; templates may read more fields than these (tool_calls, reasoning_content). */
export interface ChatMessage {
  role: string;
  content: string;
  [field: string]: unknown;
}

export interface RenderChatOptions {
  /** End with the opening of an assistant turn, so that a completion is the assistant's reply. */
  addGenerationPrompt?: boolean;
  /** Tool schemas (JSON), passed to the template as `tools` as transformers does. */
  tools?: readonly unknown[];
  /** More template variables (enable_thinking, documents…); they win over the special tokens. */
  variables?: Record<string, unknown>;
}

export class ChatTemplate {
  private readonly template: Template;

  /**
   * @param source the template text
   * @param file where it was read (named in errors)
   * @param specialTokens bos_token, eos_token… as the tokenizer sets them
   */
  constructor(
    readonly source: string,
    /** Where the template was read (named in errors). */
    readonly file: string,
    private readonly specialTokens: Record<string, string>,
  ) {
    try {
      this.template = new Template(source);
    } catch (err) {
      throw new TokenizerFileError(file, `chat_template does not parse: ${(err as Error).message}`, err);
    }
  }

  render(messages: ChatMessage[], opts: RenderChatOptions = {}): string {
    // transformers always passes tools and documents, None when not given.
    const variables: Record<string, unknown> = {
      ...this.specialTokens,
      tools: opts.tools ?? null,
      documents: null,
      ...opts.variables,
      messages,
      add_generation_prompt: opts.addGenerationPrompt ?? false,
    };
    try {
      return this.template.render(variables);
    } catch (err) {
      // raise_exception in the template (a role it does not know, turns out of order) lands here.
      throw new TokenizerFileError(
        this.file,
        `chat_template failed to render: ${(err as Error).message}`,
        err,
      );
    }
  }
}
