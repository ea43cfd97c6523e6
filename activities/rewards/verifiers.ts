// Exact-match verifiers of the built-in tasks, written from docs/tasks.md ("Verifying a
// sample") alone: the expected answer comes from the prompt text, and a sample scores 1 only
// when it stopped at <eos> with exactly that text.
import { BadRolloutError } from './errors.js';

/** Names of the built-in verifiable tasks, as docs/tasks.md and the native tools spell them. */
export const taskNames = ['add', 'sort', 'reverse'] as const;
export type TaskName = (typeof taskNames)[number];

export function isTaskName(task: string): task is TaskName {
  return (taskNames as readonly string[]).includes(task);
}

/** The fields of a rollout record a verifier reads. */
export interface VerifiableSample {
  prompt: string;
  text: string;
  finish_reason: string;
}

const decimal = /^[0-9]{1,9}$/;
const digits = /^[0-9]*$/;
const letters = /^[a-z]*$/;

function badPrompt(task: string, prompt: string, form: string): BadRolloutError {
  return new BadRolloutError(`${task} prompt ${JSON.stringify(prompt)} must look like ${form}`, {
    field: 'prompt',
    task,
    prompt,
  });
}

/**
 * The answer a `task` prompt asks for (docs/tasks.md, "Parsing rules for the expected answer").
 * Throws BadRolloutError (bad input) for an unknown task or a prompt not in the task's format.
 */
export function expectedAnswer(task: string, prompt: string): string {
  if (!isTaskName(task)) {
    throw new BadRolloutError(`unknown task ${JSON.stringify(task)}; known tasks: ${taskNames.join(', ')}`, {
      field: 'task',
      task,
      prompt,
    });
  }
  const forms: Record<TaskName, string> = { add: 'A+B=', sort: 'sort:DIGITS=', reverse: 'rev:LETTERS=' };
  if (!prompt.endsWith('=')) throw badPrompt(task, prompt, `${forms[task]} (it must end with '=')`);
  const body = prompt.slice(0, -1);
  switch (task) {
    case 'add': {
      const plus = body.indexOf('+');
      const a = plus < 0 ? '' : body.slice(0, plus);
      const b = plus < 0 ? '' : body.slice(plus + 1);
      if (!decimal.test(a) || !decimal.test(b)) {
        throw badPrompt(task, prompt, 'A+B= with A and B decimal numbers of 1 to 9 digits');
      }
      // Both operands are below 1e9, so the sum is an exact integer in a double.
      return String(Number(a) + Number(b));
    }
    case 'sort': {
      const rest = body.startsWith('sort:') ? body.slice('sort:'.length) : null;
      if (rest === null || !digits.test(rest)) throw badPrompt(task, prompt, forms.sort);
      return [...rest].sort().join('');
    }
    case 'reverse': {
      const rest = body.startsWith('rev:') ? body.slice('rev:'.length) : null;
      if (rest === null || !letters.test(rest)) throw badPrompt(task, prompt, forms.reverse);
      return [...rest].reverse().join('');
    }
  }
}

/**
 * Reward of one sample: 1 when it stopped at <eos> (`finish_reason` "stop") and its text is
 * the expected answer byte for byte, else 0. A truncated sample ("length") always scores 0.
 */
export function verify(task: string, sample: VerifiableSample): 0 | 1 {
  const expected = expectedAnswer(task, sample.prompt);
  return sample.finish_reason === 'stop' && sample.text === expected ? 1 : 0;
}
