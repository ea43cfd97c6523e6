// A child process that runs one chunk of episodes as a rollout worker's shard does: its MCP
// environment opened by ShardEnvironments (the test MCP server over stdio, started by this
// process), its policy on an OpenAI-compatible server, every turn journaled by ChunkJournal in an
// fs store. The kill tests SIGKILL it at chosen points and run it again on the same journal.
// Argument: one JSON object (see ChildArgs); writes the episodes to `out` when all have ended.
import { writeFileSync } from 'node:fs';
import { ShardEnvironments } from '../../activities/agents/environments.js';
import { ChunkJournal } from '../../activities/agents/journal.js';
import { ShardEpisodes } from '../../activities/agents/shard-episodes.js';
import { openAiEngine } from '../../activities/engines/openai.js';
import { loadTokenizer } from '../../activities/models/tokenizer.js';
import { FsStore } from '../../activities/store/fs.js';
import { agentSchema } from '../../workflows/spec-agent.js';
import { mcpTestServerCommand } from './mcp-servers.js';

export interface ChildArgs {
  store: string;
  chunkKey: string;
  attempt: number;
  engineUrl: string;
  tokenizerDir: string;
  promptTokens: number[];
  episodes: number;
  /** The test MCP server's arguments. */
  mcpArgs: string[];
  out: string;
}

const args = JSON.parse(process.argv[2]!) as ChildArgs;
const tokenizer = await loadTokenizer(args.tokenizerDir);
const agent = agentSchema.parse({
  default: { kind: 'mcp', command: mcpTestServerCommand(...args.mcpArgs), tools: ['calculator', 'charge'] },
  toolCallSeconds: 120,
});
const environments = new ShardEnvironments(agent);
const episodes = new ShardEpisodes(
  {
    agent,
    engine: openAiEngine({ baseUrl: args.engineUrl, timeoutMs: 600_000, maxRetries: 3 }),
    tokenizer,
    sampling: { temperature: 1, topP: 1 },
    contextLength: 4096,
    maxNewTokens: 64,
  },
  environments,
);
const journal = await ChunkJournal.open(new FsStore(args.store), args.chunkKey, args.attempt);
const signal = new AbortController().signal;
const done = await Promise.all(
  Array.from({ length: args.episodes }, (_, s) =>
    episodes.sample(args.promptTokens, 'arith', 1000 + s, signal, {
      journal: journal.episode(0, s),
      id: `${args.chunkKey}#0/${s}`,
    }),
  ),
);
await environments.close();
writeFileSync(args.out, JSON.stringify({ episodes: done, replayed: journal.stats.replayed }));
