// What a `moerl` command is, and the context it runs in: parsed arguments, the Temporal
// connection (opened on first use, closed by main), and one way to print a result that honours
// --json (a single JSON document) or prints readable text.
import type { ParseArgsConfig } from 'node:util';
import type { Client, Connection } from '@temporalio/client';
import {
  apiKeyFlagWarning,
  connectClient,
  temporalOptionsFrom,
  type TemporalOptions,
} from '../workers/temporal-options.js';
import { CliError } from './errors.js';

export interface CliIo {
  stdout: { write(chunk: string): unknown };
  stderr: { write(chunk: string): unknown };
  env: NodeJS.ProcessEnv;
  /** Stops long-running commands (`dev`); SIGINT/SIGTERM do the same when run from a terminal. */
  signal?: AbortSignal;
}

export type OptionsConfig = NonNullable<ParseArgsConfig['options']>;

export interface Command {
  name: string;
  /** One line for `moerl --help`. */
  summary: string;
  /** Synopsis after `moerl `, e.g. `status <campaign-id>`. */
  usage: string;
  /** Options beyond the global ones, with their help lines. */
  options: OptionsConfig;
  optionHelp: Record<string, string>;
  /** More help: what the command does, examples. */
  details?: string;
  positionals: { min: number; max: number };
  /** The first argument is a campaign id (checked before any connection is made). */
  campaignIdArgument?: boolean;
  run(ctx: CommandContext): Promise<number | void>;
}

export type OptionValues = Record<string, string | boolean | (string | boolean)[] | undefined>;

/** How long the CLI waits for a Temporal server to answer the first call. */
export const connectTimeoutMs = 5_000;

export class CommandContext {
  private connected?: Promise<{ client: Client; connection: Connection }>;
  private temporalOptions?: TemporalOptions;
  private warnedApiKey = false;

  constructor(
    readonly command: Command,
    readonly values: OptionValues,
    readonly positionals: string[],
    readonly io: CliIo,
  ) {}

  get json(): boolean {
    return this.values.json === true;
  }

  string(name: string): string | undefined {
    const v = this.values[name];
    return typeof v === 'string' ? v : undefined;
  }

  strings(name: string): string[] {
    const v = this.values[name];
    return Array.isArray(v) ? v.filter((x): x is string => typeof x === 'string') : [];
  }

  temporal(): TemporalOptions {
    if (this.temporalOptions) return this.temporalOptions;
    if (this.string('api-key') !== undefined && !this.warnedApiKey) {
      this.warnedApiKey = true;
      this.note(`moerl: ${apiKeyFlagWarning}`);
    }
    this.temporalOptions = temporalOptionsFrom(
      {
        address: this.string('address'),
        namespace: this.string('namespace'),
        apiKey: this.string('api-key'),
        apiKeyFile: this.string('api-key-file'),
        tlsCert: this.string('tls-cert'),
        tlsKey: this.string('tls-key'),
        tlsCa: this.string('tls-ca'),
        tlsServerName: this.string('tls-server-name'),
        tls: this.values.tls === true ? true : undefined,
      },
      this.io.env,
    );
    return this.temporalOptions;
  }

  /** The client, connected on first use; an unreachable server is a one-line CliError. */
  async client(): Promise<Client> {
    const opts = this.temporal();
    this.connected ??= connectClient(opts, connectTimeoutMs).catch((err: unknown) => {
      throw new CliError(`cannot reach Temporal at ${opts.address}: ${reasonOf(err)}`);
    });
    return (await this.connected).client;
  }

  async connection(): Promise<Connection> {
    await this.client();
    return (await this.connected!).connection;
  }

  async close(): Promise<void> {
    const connected = await this.connected?.catch(() => undefined);
    await connected?.connection.close().catch(() => undefined);
  }

  /** Prints the result: `json` under --json, else `text` (a function, so it is built only when needed). */
  print(json: unknown, text: () => string): void {
    this.io.stdout.write(
      this.json ? `${JSON.stringify(json, null, 2)}\n` : `${text().replace(/\n*$/, '')}\n`,
    );
  }

  /** A progress or warning line on stderr (never mixes into --json output). */
  note(line: string): void {
    this.io.stderr.write(`${line}\n`);
  }
}

/** The error and its causes on one line: "Failed to query Workflow: query timed out ...". */
export function reasonOf(err: unknown): string {
  const parts: string[] = [];
  for (let e: unknown = err; e !== undefined && e !== null && parts.length < 4; e = (e as Error).cause) {
    const text = e instanceof Error ? ((e as { details?: unknown }).details ?? e.message) : String(e);
    const line = String(text).split('\n')[0]?.trim();
    if (line && !parts.some((p) => p.includes(line))) parts.push(line);
    if (!(e instanceof Error)) break;
  }
  return parts.join(': ') || 'unknown error';
}
