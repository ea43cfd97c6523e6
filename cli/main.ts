// The `moerl` command line: parses arguments (node's util.parseArgs), runs one command, and turns
// every failure into one line on stderr and an exit code (2 for usage errors), never a stack trace.
import { parseArgs } from 'node:util';
import { SpecError } from '../workflows/spec.js';
import { checkCampaignId } from './campaigns.js';
import { cancelCommand, pauseCommand, resumeCommand } from './commands/control.js';
import { demoCommand } from './commands/demo.js';
import { devCommand } from './commands/dev.js';
import { exportCommand } from './commands/export.js';
import { forkCommand } from './commands/fork.js';
import { historyCommand } from './commands/history.js';
import { listCommand } from './commands/list.js';
import { reportCommand } from './commands/report.js';
import { setCommand } from './commands/set.js';
import { specCommand } from './commands/spec.js';
import { startCommand } from './commands/start.js';
import { statusCommand } from './commands/status.js';
import { watchCommand } from './commands/watch.js';
import { CommandContext, reasonOf, type CliIo, type Command, type OptionsConfig } from './command.js';
import { CliError, UsageError } from './errors.js';

export type { CliIo } from './command.js';

export const commands: Command[] = [
  startCommand,
  listCommand,
  statusCommand,
  watchCommand,
  pauseCommand,
  resumeCommand,
  setCommand,
  cancelCommand,
  historyCommand,
  reportCommand,
  forkCommand,
  exportCommand,
  devCommand,
  demoCommand,
  specCommand,
];

const globalOptions: OptionsConfig = {
  address: { type: 'string' },
  namespace: { type: 'string' },
  'api-key': { type: 'string' },
  'api-key-file': { type: 'string' },
  tls: { type: 'boolean' },
  'tls-cert': { type: 'string' },
  'tls-key': { type: 'string' },
  'tls-ca': { type: 'string' },
  'tls-server-name': { type: 'string' },
  json: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
};

const globalHelp = `global options (before or after the command):
  --address HOST:PORT    Temporal frontend (env TEMPORAL_ADDRESS; default 127.0.0.1:7233)
  --namespace NS         Temporal namespace (env TEMPORAL_NAMESPACE; default "default")
  --api-key-file FILE    API key read from FILE, implies TLS (env TEMPORAL_API_KEY_FILE,
                         or the key itself in TEMPORAL_API_KEY; --api-key KEY shows it in ps)
  --tls                  TLS with the system's root certificates (env TEMPORAL_TLS=true)
  --tls-cert FILE        client certificate for mTLS, with --tls-key (env TEMPORAL_TLS_CERT)
  --tls-key FILE         client key for mTLS (env TEMPORAL_TLS_KEY)
  --tls-ca FILE          CA certificate of the server (env TEMPORAL_TLS_CA)
  --tls-server-name NAME server name to verify (env TEMPORAL_TLS_SERVER_NAME)
  --json                 machine-readable output: a single JSON document on stdout
  -h, --help             help for moerl or a command
environment: MOERL_TASK_QUEUE_PREFIX prefixes the task queue names (control, rollout, train)`;

export function mainHelp(): string {
  const width = Math.max(...commands.map((c) => c.name.length));
  return [
    'moerl — durable RL post-training campaigns for Mixture-of-Experts models on Temporal',
    '',
    'usage: moerl <command> [arguments] [options]',
    '',
    'commands:',
    ...commands.map((c) => `  ${c.name.padEnd(width)}  ${c.summary}`),
    '',
    globalHelp,
    '',
    'Run "moerl <command> --help" for a command\'s arguments and options.',
  ].join('\n');
}

export function commandHelp(command: Command): string {
  const options = Object.entries(command.optionHelp);
  const width = Math.max(0, ...options.map(([k]) => k.length));
  return [
    `usage: moerl ${command.usage}`,
    '',
    `${command.summary}.`,
    ...(command.details ? ['', command.details] : []),
    ...(options.length ? ['', 'options:', ...options.map(([k, v]) => `  ${k.padEnd(width)}  ${v}`)] : []),
    '',
    globalHelp,
  ].join('\n');
}

/** The index of the command word: the first argument that is neither an option nor its value. */
function commandIndex(argv: readonly string[]): number {
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] as string;
    if (arg === '--') return i + 1 < argv.length ? i + 1 : -1;
    if (!arg.startsWith('-') || arg === '-') return i;
    const name = arg.replace(/^--?/, '');
    if (!name.includes('=') && globalOptions[name]?.type === 'string') i++;
  }
  return -1;
}

function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

function isUnavailable(err: unknown): boolean {
  for (let e: unknown = err; e instanceof Error; e = e.cause) {
    const code = (e as { code?: unknown }).code;
    if (code === 14 || /\b(UNAVAILABLE|ECONNREFUSED|ECONNRESET)\b/.test(e.message)) return true;
  }
  return false;
}

/** Runs the CLI; returns the exit code. `io` defaults to the process's streams and environment. */
export async function main(argv: readonly string[], ioOverrides: Partial<CliIo> = {}): Promise<number> {
  const io: CliIo = { stdout: process.stdout, stderr: process.stderr, env: process.env, ...ioOverrides };
  const fail = (message: string, code: number) => {
    io.stderr.write(`moerl: ${message}\n`);
    return code;
  };
  const at = commandIndex(argv);
  const name = at >= 0 ? argv[at] : undefined;
  const rest = at >= 0 ? [...argv.slice(0, at), ...argv.slice(at + 1)] : [...argv];

  if (name === undefined || name === 'help') {
    const topic = name === 'help' ? rest.find((a) => !a.startsWith('-')) : undefined;
    if (topic === undefined) {
      const asked = name === 'help' || rest.includes('--help') || rest.includes('-h');
      if (!asked && rest.length > 0) return fail(`no command given (see "moerl --help")`, 2);
      (asked ? io.stdout : io.stderr).write(`${mainHelp()}\n`);
      return asked ? 0 : 2;
    }
    const command = commands.find((c) => c.name === topic);
    if (!command) return fail(`unknown command "${topic}" (see "moerl --help")`, 2);
    io.stdout.write(`${commandHelp(command)}\n`);
    return 0;
  }
  const command = commands.find((c) => c.name === name);
  if (!command) return fail(`unknown command "${name}" (see "moerl --help")`, 2);

  let ctx: CommandContext | undefined;
  try {
    let parsed;
    try {
      parsed = parseArgs({
        args: rest,
        options: { ...globalOptions, ...command.options },
        allowPositionals: true,
        strict: true,
      });
    } catch (err) {
      // node's messages go on to explain `--`; the first sentence is the point.
      throw new UsageError((errorMessage(err).split(/\n|\. To specify/)[0] as string).replace(/\.$/, ''));
    }
    if (parsed.values.help === true) {
      io.stdout.write(`${commandHelp(command)}\n`);
      return 0;
    }
    const { min, max } = command.positionals;
    const count = parsed.positionals.length;
    if (count < min || count > max)
      throw new UsageError(
        `${count < min ? 'missing' : 'unexpected'} argument (usage: moerl ${command.usage})`,
      );
    if (command.campaignIdArgument) checkCampaignId(parsed.positionals[0] as string);
    ctx = new CommandContext(command, parsed.values, parsed.positionals, io);
    return (await command.run(ctx)) ?? 0;
  } catch (err) {
    if (err instanceof UsageError) {
      const see = /\(usage: /.test(err.message) ? '' : ` (see "moerl ${command.name} --help")`;
      return fail(`${command.name}: ${err.message}${see}`, 2);
    }
    if (err instanceof SpecError) return fail(err.message, 1);
    if (err instanceof CliError) return fail(err.message, 1);
    if (isUnavailable(err)) {
      const address = safeAddress(ctx);
      return fail(`cannot reach Temporal${address ? ` at ${address}` : ''}: ${reasonOf(err)}`, 1);
    }
    return fail(reasonOf(err), 1);
  } finally {
    await ctx?.close();
  }
}

function safeAddress(ctx: CommandContext | undefined): string | undefined {
  try {
    return ctx?.temporal().address;
  } catch {
    return undefined;
  }
}
