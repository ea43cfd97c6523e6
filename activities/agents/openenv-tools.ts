// An OpenEnv environment of agentic rollouts: an environment with state of its own (a game, a
// simulated user, a coding sandbox) served by OpenEnv's create_app. The model is given one tool
// whose arguments are the environment's action (its JSON Schema from GET /schema); each call is
// one step. Each episode has a session of its own, a WebSocket on /ws (the HTTP routes make a
// new environment per request), reset with the episode's seed when the first call needs it.
// Each step's observation is the tool's result, its reward and `done` the episode's.
//
// A session lost (the server restarted, the worker was lost and the episode is read back from
// the journal) is made again: reset with the same seed, the episode's steps so far sent again
// in order. If a step then answers other than it did, the environment is not deterministic and
// cannot be driven back: the call ends the episode `environment-lost`.
import WebSocket from 'ws';
import type { OpenEnvSpec } from '../../workflows/spec-agent.js';
import { BadInputError } from '../rewards/errors.js';
import type { EnvironmentRunner } from './environments.js';
import type { EnvironmentStep, ToolCallRecord, ToolRunner } from './episode.js';
import type { ToolSchema } from './tool-calls.js';

export interface OpenEnvOptions {
  /** Wall time of reading the environment's schema, and of opening a session. */
  connectMs: number;
  /** Characters of an observation the model is shown; the rest is cut, saying so (default 16000). */
  maxResultChars?: number;
}

/** An environment's runner: `episode` opens the session of one episode. */
export interface OpenEnvRunner extends EnvironmentRunner {
  episode(seed: number): EpisodeSession;
}

export interface EpisodeSession extends ToolRunner {
  close(): Promise<void>;
}

/** One reply frame of /ws: an observation, a state, or an error. */
interface Frame {
  type: string;
  data?: {
    observation?: Record<string, unknown>;
    reward?: unknown;
    done?: unknown;
    message?: unknown;
    code?: unknown;
  };
}

/** The action's JSON Schema as the model's tool arguments: without the `metadata` every action has. */
function actionParameters(schema: unknown, name: string): Record<string, unknown> {
  const action = (schema as { action?: unknown } | null)?.action;
  if (action === null || typeof action !== 'object' || Array.isArray(action))
    throw new BadInputError(`${name}: GET /schema has no action schema`);
  const { properties, required, ...rest } = action as {
    properties?: Record<string, unknown>;
    required?: string[];
  };
  const kept = Object.fromEntries(Object.entries(properties ?? {}).filter(([k]) => k !== 'metadata'));
  const needed = (required ?? []).filter((k) => k !== 'metadata');
  return { ...rest, properties: kept, ...(needed.length > 0 ? { required: needed } : {}) };
}

/** The reward of a step: numbers as they are, booleans as 1 and 0, anything else none. */
function rewardOf(value: unknown): number | undefined {
  if (typeof value === 'number' && Number.isFinite(value)) return value;
  if (typeof value === 'boolean') return value ? 1 : 0;
  return undefined;
}

class SessionLost extends Error {
  override name = 'SessionLost';
}

/** A WebSocket session on /ws: one frame out, one frame back, in order. */
class Session {
  private waiting: { resolve: (f: Frame) => void; reject: (e: Error) => void } | null = null;
  private lost: Error | null = null;

  private constructor(private readonly socket: WebSocket) {
    socket.on('message', (data) => {
      const waiting = this.waiting;
      this.waiting = null;
      let frame: Frame;
      try {
        frame = JSON.parse(String(data)) as Frame;
      } catch {
        return waiting?.reject(
          new SessionLost(`sent a frame that is not JSON: ${String(data).slice(0, 200)}`),
        );
      }
      waiting?.resolve(frame);
    });
    const fail = (err: Error) => {
      this.lost ??= new SessionLost(err.message);
      this.waiting?.reject(this.lost);
      this.waiting = null;
    };
    socket.on('close', (code) => fail(new Error(`the session closed (code ${code})`)));
    socket.on('error', fail);
  }

  static open(url: string, ms: number, signal: AbortSignal): Promise<Session> {
    return new Promise<Session>((resolve, reject) => {
      const socket = new WebSocket(url, { handshakeTimeout: ms, maxPayload: 16 << 20 });
      const onAbort = () => socket.terminate();
      signal.addEventListener('abort', onAbort, { once: true });
      socket.once('open', () => {
        signal.removeEventListener('abort', onAbort);
        resolve(new Session(socket));
      });
      socket.once('error', (err) => {
        signal.removeEventListener('abort', onAbort);
        reject(new SessionLost(err.message));
      });
    });
  }

  get alive(): boolean {
    return this.lost === null && this.socket.readyState === WebSocket.OPEN;
  }

  request(frame: object, signal: AbortSignal): Promise<Frame> {
    if (this.lost) return Promise.reject(this.lost);
    return new Promise<Frame>((resolve, reject) => {
      const onAbort = () => {
        this.waiting = null;
        // A reply that comes after the call gave up would answer the next one: the session goes.
        this.socket.terminate();
        reject(signal.reason as Error);
      };
      signal.addEventListener('abort', onAbort, { once: true });
      this.waiting = {
        resolve: (f) => {
          signal.removeEventListener('abort', onAbort);
          resolve(f);
        },
        reject: (e) => {
          signal.removeEventListener('abort', onAbort);
          reject(e);
        },
      };
      this.socket.send(JSON.stringify(frame));
    });
  }

  close(): void {
    if (this.socket.readyState === WebSocket.OPEN) this.socket.send(JSON.stringify({ type: 'close' }));
    this.socket.close();
  }
}

/** Reads the environment's action schema: the tool the model is given. */
export async function openEnvTools(
  spec: OpenEnvSpec,
  options: OpenEnvOptions,
): Promise<{ tools: ToolSchema[]; runner: OpenEnvRunner }> {
  const name = `OpenEnv environment ${spec.url}`;
  const base = spec.url.replace(/\/+$/, '');
  const maxChars = options.maxResultChars ?? 16_000;
  let schema: unknown;
  try {
    const response = await fetch(`${base}/schema`, { signal: AbortSignal.timeout(options.connectMs) });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    schema = await response.json();
  } catch (err) {
    throw new Error(`${name}: GET /schema failed: ${(err as Error).message}`);
  }
  const tool: ToolSchema = {
    type: 'function',
    function: {
      name: spec.tool,
      description: spec.description ?? 'Takes one action in the environment and returns what it observes',
      parameters: actionParameters(schema, name),
    },
  };
  const wsUrl = `${base.replace(/^http/, 'ws')}/ws`;
  const sessions = new Set<EpisodeSession>();

  const runner: OpenEnvRunner = {
    // The environment's state changes with each step: a step sent again is another step.
    idempotent: () => false,
    call: () => Promise.reject(new Error(`${name}: a call needs an episode's session`)),
    close: async () => {
      await Promise.all([...sessions].map((s) => s.close()));
    },
    episode(seed) {
      /** The episode's steps so far: what a new session is driven through. */
      const history: { args: Record<string, unknown>; text: string }[] = [];
      let session: Session | null = null;

      const text = (frame: Frame): string => {
        const { metadata: _metadata, ...observation } = frame.data?.observation ?? {};
        const shown = JSON.stringify(observation);
        return shown.length > maxChars
          ? `${shown.slice(0, maxChars)}\n[cut: ${shown.length - maxChars} more characters]`
          : shown;
      };
      const reply = (frame: Frame, what: string): Frame => {
        if (frame.type === 'observation') return frame;
        const message = typeof frame.data?.message === 'string' ? frame.data.message : JSON.stringify(frame);
        if (frame.type === 'error' && frame.data?.code === 'CAPACITY_REACHED') throw new SessionLost(message);
        throw new Error(`${name}: ${what}: ${message}`);
      };
      /** A session reset with the episode's seed and driven through its steps so far, or why not. */
      const fresh = async (signal: AbortSignal): Promise<Session | string> => {
        const s = await Session.open(wsUrl, options.connectMs, signal);
        reply(await s.request({ type: 'reset', data: { ...spec.resetArgs, seed } }, signal), 'reset');
        for (const [i, step] of history.entries()) {
          const again = text(
            reply(await s.request({ type: 'step', data: step.args }, signal), `step ${i + 1} again`),
          );
          if (again !== step.text) {
            s.close();
            return `step ${i + 1} of the episode, sent again to a new session, observed ${again.slice(0, 200)} instead of ${step.text.slice(0, 200)}`;
          }
        }
        return s;
      };
      const episode: EpisodeSession = {
        idempotent: () => false,
        replayed(_name, args, outcome: ToolCallRecord) {
          if (!outcome.error) history.push({ args, text: outcome.result });
        },
        async call(_toolName, args, signal): Promise<EnvironmentStep> {
          // A lost session is made again until the call's time runs out (a server restarting).
          for (;;) {
            try {
              if (!session?.alive) {
                const made = await fresh(signal);
                if (typeof made === 'string') return { text: `${name}: ${made}`, lost: true };
                session = made;
              }
              const frame = reply(await session.request({ type: 'step', data: args }, signal), 'step');
              const step = { args, text: text(frame) };
              history.push(step);
              const reward = rewardOf(frame.data?.reward);
              return {
                text: step.text,
                ...(reward !== undefined ? { reward } : {}),
                done: frame.data?.done === true,
              };
            } catch (err) {
              if (!(err instanceof SessionLost) || signal.aborted) throw err;
              session = null;
              await new Promise((resolve) => setTimeout(resolve, 250));
            }
          }
        },
        async close() {
          sessions.delete(episode);
          session?.close();
          session = null;
        },
      };
      sessions.add(episode);
      return episode;
    },
  };
  return { tools: [tool], runner };
}
