// Errors the CLI reports as one line and an exit code, never as a stack trace.

/** A bad command line: unknown option, missing argument, malformed value. Exit code 2. */
export class UsageError extends Error {
  override readonly name = 'UsageError';
}

/** A failure the user can act on (unknown campaign, checkpoint not retained, ...). Exit code 1. */
export class CliError extends Error {
  override readonly name = 'CliError';
}
