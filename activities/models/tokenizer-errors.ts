// The error of a bad Hugging Face tokenizer directory: it names the file and what is wrong, and
// is bad input (never retried), like every other input that cannot succeed.
import { BadInputError } from '../rewards/errors.js';

export class TokenizerFileError extends BadInputError {
  override name = 'TokenizerFileError';
  constructor(
    /** The file that is missing or wrong. */
    readonly file: string,
    /** What is wrong with it. */
    readonly detail: string,
    cause?: unknown,
  ) {
    super(`${file}: ${detail}`, { cause });
  }
}
