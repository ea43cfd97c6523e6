// An agentic campaign end to end, its OpenAI-compatible server a scripted fake: the rows of data
// source `arith` are episodes with a calculator, the sandboxed one (a real sandboxed process) or
// a real MCP server's (test/support/mcp-test-server.ts, over stdio), those of
// `arith/hard` stay one-shot completions. The fake answers an episode's first turn with a Hermes
// tool call for the prompt's sum and its second with the calculator's result from the tool turn
// it was sent (or a wrong sum on odd seeds, so the groups have a signal); the records carry the
// episode and its loss mask, a reward function reads the whole trajectory, and moe_train's update on
// the masked episodes commits. Everything but the server is real: Temporal, the workers'
// activities, the store, the sandbox, the chat template's render, moe_train.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { environmentTurnIds } from '../../activities/agents/turn-render.js';
import { workerActivityDeps } from '../../activities/deps.js';
import { createActivities } from '../../activities/index.js';
import * as keys from '../../activities/layout.js';
import { loadTokenizer, type HfTokenizer } from '../../activities/models/tokenizer.js';
import { parseRolloutLine } from '../../activities/rewards/rollout-record.js';
import { availableIsolation } from '../../activities/rewards/sandbox.js';
import { openStore } from '../../activities/store/index.js';
import type { EpisodeRecord } from '../../activities/agents/episode.js';
import type { AgentEnvironmentSpec } from '../../workflows/spec-agent.js';
import type { CampaignSpec } from '../../workflows/spec.js';
import type { RewardChoiceSpec } from '../../workflows/spec-rewards.js';
import type { CampaignState } from '../../workflows/types.js';
import { artifacts, resultWithin, startCampaign, withWorkers } from '../support/campaign-harness.js';
import { chatmlToolsTemplate } from '../fixtures/agent-chat-cases.js';
import { startFakeRolloutServer, type FakeRolloutServer } from '../support/fake-rollout-server.js';
import { hfCampaignSpec, writeHfCampaignFixture } from '../support/hf-campaign-fixtures.js';
import { mcpTestServerCommand } from '../support/mcp-servers.js';
import { arithmeticRow, writeJsonl } from '../support/dataset-fixtures.js';
import { nativeTools } from '../support/native-tools.js';
import { openEnvSkip, startOpenEnvServer } from '../support/openenv-server.js';
import { pythonReference } from '../support/python-reference.js';
import { startTestEnvironment, type TestEnvironment } from '../support/temporal.js';

const pyref = pythonReference();
/** A reward over the whole episode: 1 when the last answer is the last tool result and right. */
const trajectoryScore = `
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    messages = extra_info["messages"]
    tools = [m["content"] for m in messages if m["role"] == "tool"]
    answers = [m["content"] for m in messages if m["role"] == "assistant"]
    return 1.0 if tools and answers[-1] == solution_str == tools[-1] == ground_truth else 0.0
`;
const native = nativeTools(['moe_train', 'moe_hf']);

describe(
  'an agentic campaign with tools (scripted OpenAI-compatible server)',
  { skip: pyref.skip || native.skip },
  () => {
    let t: TestEnvironment;
    let dir: string;
    let server: FakeRolloutServer;
    let tokenizer: HfTokenizer;
    /** The prompt ids of every completion request the fake was sent, as text (ids joined). */
    const prompts = new Set<string>();

    // The fake's answer to one request: the sum's tool call, the tool's result, or a one-shot reply.
    function reply(prompt: number[], seed: number, maxTokens: number): string {
      const text = tokenizer.decode(prompt);
      const toolTurn = /<tool_response>\n([\s\S]*?)\n<\/tool_response>/.exec(text);
      let answer: string;
      if (text.includes('guess_number')) {
        // The guessing game: a binary search on 1..4 from the guesses and hints so far.
        let [lo, hi] = [1, 4];
        const guesses = [...text.matchAll(/"guess": (\d+)/g)].map((m) => Number(m[1]));
        const hints = [...text.matchAll(/"hint":"(\w+)"/g)].map((m) => m[1]);
        for (const [i, g] of guesses.entries()) {
          if (hints[i + 1] === 'higher') lo = g + 1;
          if (hints[i + 1] === 'lower') hi = g - 1;
        }
        const guess = Math.floor((lo + hi) / 2);
        answer = `<tool_call>\n${JSON.stringify({ name: 'guess_number', arguments: { guess } })}\n</tool_call>`;
      } else if (toolTurn) answer = seed % 2 === 0 ? toolTurn[1]! : '0';
      else if (text.includes('calculator')) {
        const [, a, b] = /holds (\d+) apples and another (\d+)/.exec(text)!;
        answer = `<tool_call>\n${JSON.stringify({ name: 'calculator', arguments: { expression: `${a}+${b}` } })}\n</tool_call>`;
      } else answer = '42';
      const whole = [...tokenizer.encode(answer), tokenizer.eosTokenId];
      const ids = whole.slice(0, maxTokens);
      return JSON.stringify({
        choices: [
          {
            finish_reason: ids.length < whole.length ? 'length' : 'stop',
            logprobs: { tokens: ids.map((id) => `token_id:${id}`), token_logprobs: ids.map(() => -0.5) },
          },
        ],
      });
    }

    before(async () => {
      t = await startTestEnvironment();
      dir = mkdtempSync(join(tmpdir(), 'moerl-agent-campaign-'));
      await writeHfCampaignFixture(dir, pyref);
      writeFileSync(join(dir, 'trajectory_score.py'), trajectoryScore);
      // The test model's own template ignores `tools`: one that lists them in the system turn,
      // by name alone (their schemas would take most of the tiny model's 512 positions).
      const model = join(dir, 'store', 'models', 'tiny-qwen3');
      const template = chatmlToolsTemplate.replace('{{- tool | tojson }}', '{{- tool.function.name }}');
      assert.notEqual(template, chatmlToolsTemplate);
      writeFileSync(join(model, 'chat_template.jinja'), template);
      tokenizer = await loadTokenizer(model);
      server = await startFakeRolloutServer((body) => {
        const request = body as { prompt: number[]; seed: number; max_tokens: number };
        prompts.add(request.prompt.join(','));
        return reply(request.prompt, request.seed, request.max_tokens);
      });
    });
    after(async () => {
      await server?.close();
      await t?.teardown();
      rmSync(dir, { recursive: true, force: true });
    });

    /** Runs `spec` on workers whose rollout server is the scripted fake, to its end. */
    async function runToEnd(spec: CampaignSpec) {
      const deps = workerActivityDeps(new AbortController().signal, {
        ...process.env,
        MOERL_CACHE_DIR: join(dir, 'cache'),
        MOERL_ROLLOUT_ENGINE_URL: server.url,
        MOERL_ROLLOUT_ENGINE_WEIGHTS_DIR: join(dir, 'weights'),
        MOERL_REWARD_ISOLATION: availableIsolation(),
      });
      try {
        return await withWorkers(t.nativeConnection, t.namespace, createActivities(deps), async (queues) => {
          const handle = await startCampaign(t.client, spec, queues);
          await resultWithin(handle, 180_000);
          return { id: handle.workflowId, state: await handle.query<CampaignState>('status') };
        });
      } finally {
        await deps.rolloutServer?.close();
      }
    }

    /**
     * Runs a one-iteration campaign whose `arith` rows are episodes in `environment`, scored by
     * `reward`; its state, store, rollout records and reward lines.
     */
    async function runCampaign(
      name: string,
      environment: AgentEnvironmentSpec,
      reward: RewardChoiceSpec,
      limits: { maxTurns?: number; maxEpisodeTokens?: number } = {},
    ) {
      const spec = hfCampaignSpec(dir, name, {
        iterations: 1,
        engine: { trainer: 'native', rollout: 'openai' },
        agent: { bySource: { arith: environment }, ...limits },
        rewards: { default: { kind: 'match' }, bySource: { arith: reward } },
      });
      const { id, state } = await runToEnd(spec);
      assert.equal(state.committedIteration, 1, 'the update on the episodes committed');
      const summary = state.recentIterations.at(-1)?.episodes;

      const store = openStore(spec.store);
      const records = [...(await artifacts(store, id))]
        .filter(([key]) => key.startsWith('rollouts/'))
        .flatMap(([key, text]) =>
          text
            .split('\n')
            .filter(Boolean)
            .map((line, i) => ({
              parsed: parseRolloutLine(line, { source: key, line: i + 1 }, { eosIds: tokenizer.eosTokenIds }),
              episode: (JSON.parse(line) as { episode?: EpisodeRecord }).episode,
            })),
        );
      const rewardLines = [...(await artifacts(store, id))]
        .filter(([key]) => key.startsWith('rewards/'))
        .flatMap(([, text]) => text.split('\n').filter(Boolean))
        .map((l) => JSON.parse(l) as { prompt_id: number; sample_index: number; reward: number });
      return { id, state, summary, store, records, rewardLines };
    }

    /** Runs a campaign whose `arith` rows call `calculator` in `environment`; checks its artifacts. */
    async function campaignWith(name: string, environment: AgentEnvironmentSpec) {
      // The episodes' reward reads their trajectory: right only when the answer is the tool's.
      const trajectory = { kind: 'python' as const, file: join(dir, 'trajectory_score.py') };
      const { id, summary, store, records, rewardLines } = await runCampaign(name, environment, trajectory);
      const episodes = records.filter((r) => r.episode);
      const oneShot = records.filter((r) => !r.episode);
      assert.ok(
        episodes.length > 0 && oneShot.length > 0,
        `${episodes.length} episodes, ${oneShot.length} one-shot`,
      );
      for (const r of oneShot) assert.equal(r.parsed.loss_mask, undefined);

      for (const { parsed, episode } of episodes) {
        const [p1, env, p2] = episode!.turns;
        assert.equal(episode!.end_reason, 'answered');
        assert.deepEqual([p1?.role, env?.role, p2?.role], ['policy', 'environment', 'policy']);
        assert.ok(env?.role === 'environment');
        const [callRecord] = env.calls;
        const [a, b] = (callRecord!.arguments as { expression: string }).expression.split('+').map(Number);
        assert.equal(callRecord!.result, String(a! + b!), 'the sandboxed calculator answered');
        // The environment's ids are the chat template's tool turn, masked; the policy's are trained.
        const envIds = environmentTurnIds(tokenizer, [
          { role: 'tool', name: 'calculator', content: callRecord!.result },
        ]);
        assert.deepEqual(parsed.tokens.slice(env.start, env.end), envIds);
        assert.deepEqual(
          parsed.loss_mask,
          parsed.tokens.map((_, i) => (i >= env.start && i < env.end ? 0 : 1)),
        );
        assert.ok(parsed.logprobs.every((lp, i) => (parsed.loss_mask![i] ? lp === -0.5 : lp === 0)));
        assert.match(parsed.text, /^\d+$/, 'the text is the last turn, the answer');
        // The second turn was asked with every id of the episode so far.
        const secondTurn = [...parsed.prompt_tokens, ...parsed.tokens.slice(0, env.end)];
        assert.ok(
          prompts.has(secondTurn.join(',')),
          'a second turn sent with the prompt, the first turn and the tool turn',
        );
      }

      const scores = rewardLines.map((r) => r.reward);
      for (const { parsed, episode } of episodes) {
        const env = episode!.turns[1];
        const result = env?.role === 'environment' ? env.calls[0]!.result : '';
        const reward = rewardLines.find(
          (r) => r.prompt_id === parsed.prompt_id && r.sample_index === parsed.sample_index,
        );
        assert.equal(
          reward?.reward,
          parsed.text === result ? 1 : 0,
          'the trajectory reward saw the tool turn',
        );
      }
      assert.ok(
        scores.includes(1) && scores.includes(0),
        'right answers (through the tool) and wrong ones scored',
      );
      assert.ok(await store.head(`${keys.checkpointKey(id, 1)}/manifest.json`));
      // The iteration's summary counts its episodes, their turns and calls.
      assert.deepEqual(
        summary && [summary.episodes, summary.policyTurns, summary.endReasons, summary.toolCalls],
        [
          episodes.length,
          2 * episodes.length,
          { answered: episodes.length },
          { calculator: episodes.length },
        ],
      );
      assert.ok(summary!.toolSeconds + summary!.generationSeconds > 0, 'tool and generation time measured');
      return { episodes: episodes.length };
    }

    test('episodes call the sandboxed calculator turn by turn; records, rewards and the masked update follow', async () => {
      await campaignWith('agent', { kind: 'tools', builtin: ['calculator'] });
    });

    test(
      'episodes play an OpenEnv environment: its reward scores them, its end ends them',
      { skip: openEnvSkip },
      async () => {
        const env = await startOpenEnvServer('guess_env:app', join(dir, 'openenv.log'));
        try {
          const openenv = {
            kind: 'openenv' as const,
            url: env.url,
            tool: 'guess_number',
            resetArgs: { high: 4 },
          };
          const { state, summary, records, rewardLines } = await runCampaign(
            'agent-openenv',
            openenv,
            { kind: 'environment' },
            { maxTurns: 2, maxEpisodeTokens: 300 },
          );
          assert.equal(state.committedIteration, 1);
          const episodes = records.filter((r) => r.episode);
          assert.ok(episodes.length > 0);
          for (const { parsed, episode } of episodes) {
            assert.ok(['environment-done', 'max-turns'].includes(episode!.end_reason), episode!.end_reason);
            const won = episode!.end_reason === 'environment-done';
            assert.equal(episode!.environment_reward, won ? 1 : 0);
            const line = rewardLines.find(
              (r) => r.prompt_id === parsed.prompt_id && r.sample_index === parsed.sample_index,
            );
            assert.equal(line?.reward, won ? 1 : 0, 'the environment reward is the reward');
          }
          assert.ok(summary!.endReasons['environment-done']! > 0, JSON.stringify(summary));
        } finally {
          await env.process.stop(2000);
        }
      },
    );

    test('an SFT warm start learns multi-turn demonstrations with tool calls on their assistant turns only', async () => {
      // The fixture's rows, each with a demonstration: the calculator's call, its result, the answer.
      const rows = Array.from({ length: 8 }, (_, i) => {
        const row = arithmeticRow(i);
        const [a, b] = /holds (\d+) apples and another (\d+)/
          .exec(row.prompt[1]!.content)!
          .slice(1)
          .map(Number);
        const call = JSON.stringify({ name: 'calculator', arguments: { expression: `${a}+${b}` } });
        return {
          ...row,
          data_source: 'arith',
          demonstration: [
            { role: 'assistant', content: `<tool_call>\n${call}\n</tool_call>` },
            { role: 'tool', name: 'calculator', content: String(a! + b!) },
            { role: 'assistant', content: String(a! + b!) },
          ],
        };
      });
      await writeJsonl(join(dir, 'store', 'datasets', 'demonstrations.jsonl'), rows);
      const spec = hfCampaignSpec(dir, 'agent-sft', {
        iterations: 1,
        engine: { trainer: 'native', rollout: 'openai' },
        task: {
          dataset: { train: 'datasets/demonstrations.jsonl', format: 'jsonl', responseKey: 'demonstration' },
        },
        sftWarmStartSteps: 2,
        agent: { default: { kind: 'tools', builtin: ['calculator'] } },
        rewards: { default: { kind: 'python', file: join(dir, 'trajectory_score.py') } },
      });
      const { id, state } = await runToEnd(spec);
      assert.equal(state.committedIteration, 1, 'SFT on the demonstrations, then GRPO on episodes');
      const store = openStore(spec.store);
      const examples = (await store.get(keys.sftExamplesKey(id)))
        .toString('utf8')
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l) as { prompt_tokens: number[]; tokens: number[]; loss_mask: number[] });
      assert.ok(examples.length > 0);
      for (const e of examples) {
        // The prompt offers the calculator, as the episodes' prompts do.
        assert.match(tokenizer.decode(e.prompt_tokens), /calculator/);
        const untrained = tokenizer.decode(e.tokens.filter((_, i) => e.loss_mask[i] === 0));
        const trained = tokenizer.decode(e.tokens.filter((_, i) => e.loss_mask[i] === 1));
        assert.match(
          untrained,
          /^\n<\|im_start\|>tool\n<tool_response>\n\d+\n<\/tool_response><\|im_end\|>\n<\|im_start\|>assistant\n$/,
        );
        assert.match(
          trained,
          /^<tool_call>\n\{"name":"calculator".*\}\n<\/tool_call><\|im_end\|>\d+<\|im_end\|>$/s,
        );
      }
    });

    test("episodes call an MCP server's calculator (stdio), each call reaching it once", async () => {
      const callsFile = join(dir, 'mcp-calls.jsonl');
      const { episodes } = await campaignWith('agent-mcp', {
        kind: 'mcp',
        command: mcpTestServerCommand('--calls-file', callsFile),
        tools: ['calculator'],
      });
      const calls = readFileSync(callsFile, 'utf8').trim().split('\n');
      assert.equal(calls.length, episodes, 'one call per episode, from the server the shard started');
    });
  },
);
