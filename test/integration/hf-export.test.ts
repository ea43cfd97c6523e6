// `moerl export` and activities/models/export.ts on a real campaign layout: two tiny Qwen3-MoE
// models made offline by test/reference/hf_models.py (seeds 0 and 1), each imported with
// `moe_train init --from-hf` on 2 EP ranks and committed as iterations 0 and 1 of a campaign in an
// fs store, with the model's files under campaigns/<id>/model/. Exports to a local folder and to
// S3 (versitygw) are checked against the source: every tensor bitwise, tokenizer and config files
// byte-equal, transformers' AutoModelForCausalLM scores them as the source, config.json written
// last (also when an upload fails midway, and while a reader lists the bucket); bad input named.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { S3Client } from '@aws-sdk/client-s3';
import { commitCheckpoint, stageCheckpoint } from '../../activities/checkpoints/commit.js';
import * as keys from '../../activities/layout.js';
import { exportCheckpoint, type ExportResult } from '../../activities/models/export.js';
import { FsStore, S3Store } from '../../activities/store/index.js';
import { freePort } from '../../cli/dev-server.js';
import { main } from '../../cli/main.js';
import { repoRoot } from '../../cli/temporal-tools.js';
import { snapshot } from '../support/bucket-watch.js';
import { FaultyStore } from '../support/checkpoint-fixtures.js';
import { nativeTools } from '../support/native-tools.js';
import { pythonReference } from '../support/python-reference.js';
import { startTestEnvironment, type TestEnvironment } from '../support/temporal.js';
import { startVersitygw, type Versitygw } from '../support/versitygw.js';
import { awsEnv, directClient, s3Location } from '../support/versitygw-access.js';

const tools = nativeTools(['moe_train', 'moe_hf']);
const pyref = pythonReference();
const work = mkdtempSync(join(tmpdir(), 'moerl-hf-export-'));
after(() => rmSync(work, { recursive: true, force: true }));

const campaignId = `hfx-${randomUUID().slice(0, 6)}`;
/** A campaign whose checkpoints are moerl's own models: nothing under model/. */
const plainId = `plain-${randomUUID().slice(0, 6)}`;
const storeDir = join(work, 'store');
const store = new FsStore(storeDir);
const source = (seed: number) => join(work, `qwen3-seed${seed}`);
const sequences = join(work, 'sequences.jsonl');
const shardBytes = 200_000; // several shards and the index for the ~1 MB test model
const sideFiles = ['tokenizer.json', 'tokenizer_config.json', 'generation_config.json', 'config.json'];

/** moe_train init --from-hf on 2 local EP ranks under the rank contract, into one folder. */
async function importOnTwoRanks(hfDir: string, out: string): Promise<void> {
  const port = await freePort();
  await Promise.all(
    [0, 1].map((rank) => {
      const child = spawn(
        tools.bin('moe_train'),
        ['init', '--from-hf', hfDir, '--out', out, '--max-seq-len', '64'],
        {
          env: {
            ...tools.env,
            MOERL_RANK: String(rank),
            MOERL_WORLD_SIZE: '2',
            MOERL_COORDINATOR: `127.0.0.1:${port}`,
            MOERL_FI_PROVIDER: 'shm',
            MOERL_JOB_TOKEN: 'hf-export-test',
          },
          stdio: ['ignore', 'ignore', 'pipe'],
        },
      );
      let err = '';
      child.stderr.on('data', (d: Buffer) => (err += d.toString()));
      return new Promise<void>((resolve, reject) =>
        child.on('exit', (code) =>
          code === 0 ? resolve() : reject(new Error(`moe_train init rank ${rank} exited ${code}: ${err}`)),
        ),
      );
    }),
  );
}

/** Imports the seed's model and commits it as `iteration` of `id`. */
async function commitImported(seed: number, id: string, iteration: number): Promise<void> {
  const local = join(work, `ckpt-${id}-${iteration}`);
  await importOnTwoRanks(source(seed), local);
  const staged = await stageCheckpoint(store, local, id, iteration);
  await commitCheckpoint(store, staged, {
    meanReward: null,
    keepLast: 10,
    keepBest: false,
    keepIteration: 0,
    now: new Date(),
  });
}

const compare = async (a: string, b: string) =>
  JSON.parse(await pyref.run('hf_models.py', ['compare', a, b])) as {
    tensors: number;
    missing: string[];
    bitwise: boolean;
    worst: string;
  };

/** The export in `dir` is the seed's model: bitwise tensors, byte-equal files, transformers agrees. */
async function assertIsSource(dir: string, seed: number): Promise<void> {
  const c = await compare(source(seed), dir);
  assert.deepEqual(c.missing, []);
  assert.ok(c.tensors > 20 && c.bitwise, `not bitwise: worst ${c.worst}`);
  for (const name of sideFiles)
    assert.ok(readFileSync(join(dir, name)).equals(readFileSync(join(source(seed), name))), name);
  assert.match(readFileSync(join(dir, 'model.safetensors.index.json'), 'utf8'), /model-00002-of-/);
  // AutoModelForCausalLM.from_pretrained reads the export and computes what it computes on the source
  sourceScores[seed] ??= await pyref.run('hf_models.py', ['score', source(seed), sequences]);
  assert.equal(await pyref.run('hf_models.py', ['score', dir, sequences]), sourceScores[seed]);
}
const sourceScores: (string | undefined)[] = [];

const names = (r: ExportResult) => r.files.map((f) => f.name);

describe('moerl export', { skip: tools.skip || pyref.skip }, () => {
  let gw: Versitygw;
  let bucket: string;
  let s3: S3Client;
  let t: TestEnvironment;
  let libraryOut: ExportResult;
  const s3Target = (prefix: string) =>
    new S3Store(
      { ...s3Location(gw, bucket), prefix },
      { credentials: { accessKeyId: gw.accessKey, secretAccessKey: gw.secretKey } },
    );

  before(async () => {
    await Promise.all(
      [0, 1].map((seed) =>
        pyref.run('hf_models.py', ['make', source(seed), '--family', 'qwen3_moe', '--seed', String(seed)]),
      ),
    );
    writeFileSync(sequences, `${JSON.stringify({ tokens: [5, 17, 300, 1999, 42, 7, 7, 8, 1024, 3] })}\n`);
    await commitImported(0, campaignId, 0);
    await commitImported(1, campaignId, 1);
    await commitImported(0, plainId, 0);
    for (const name of keys.hfModelFiles)
      if (existsSync(join(source(0), name)))
        await store.put(`${keys.modelPrefix(campaignId)}/${name}`, readFileSync(join(source(0), name)));
    gw = await startVersitygw();
    bucket = await gw.createBucket();
    s3 = directClient(gw);
    t = await startTestEnvironment();
    for (const id of [campaignId, plainId]) {
      const spec = join(work, `${id}.yaml`);
      writeFileSync(
        spec,
        [
          `name: ${id.split('-')[0]}`,
          'task: { builtin: add }',
          'model: { layers: 1, hidden: 16, heads: 2, experts: 4, topK: 2 }',
          'iterations: 2',
          'promptsPerIteration: 4',
          'groupSize: 2',
          'rolloutShards: 1',
          'chunkSize: 2',
          'epWorldSize: 2',
          'seed: 1',
          `store: { kind: fs, path: ${JSON.stringify(storeDir)} }`,
        ].join('\n'),
      );
      // No worker polls these queues: the campaign stays as started, its spec in its history.
      const r = await cli('start', spec, '--id', id);
      assert.equal(r.code, 0, r.stderr);
    }
  });

  after(async () => {
    s3?.destroy();
    await t?.teardown();
    await gw?.stop();
  });

  async function cli(...args: string[]) {
    let stdout = '';
    let stderr = '';
    const code = await main([...args, '--address', t.address, '--namespace', t.namespace], {
      stdout: { write: (s: string) => (stdout += s) },
      stderr: { write: (s: string) => (stderr += s) },
      env: { MOERL_TASK_QUEUE_PREFIX: `hfx-${campaignId}-` },
    });
    return { code, stdout, stderr };
  }

  it('exports the latest checkpoint to a local folder: bitwise, side files equal, transformers loads it', async () => {
    const out = join(work, 'library', 'latest');
    const steps: string[] = [];
    libraryOut = await exportCheckpoint({
      store,
      campaignId,
      target: { kind: 'dir', path: out },
      maxShardBytes: shardBytes,
      onStep: (line) => steps.push(line),
    });
    assert.equal(libraryOut.iteration, 1, 'LATEST is iteration 1');
    assert.equal(names(libraryOut).at(-1), 'config.json');
    assert.deepEqual(names(libraryOut).sort(), readdirSync(out).sort());
    assert.equal(steps.length, 3);
    await assertIsSource(out, 1);
    // nothing left beside the target or in the work folder
    assert.deepEqual(readdirSync(join(work, 'library')), ['latest']);
  });

  it('writes to S3 with config.json last, and an upload failing midway leaves no config.json', async () => {
    const recorded = new FaultyStore(s3Target('library/it0'));
    const r = await exportCheckpoint({
      store,
      campaignId,
      iteration: 0,
      target: { kind: 'store', store: recorded },
      maxShardBytes: shardBytes,
    });
    const uploads = recorded.mutations.filter((m) => m.startsWith('putFile '));
    assert.deepEqual(
      uploads.map((m) => m.slice('putFile '.length)),
      names(r),
    );
    assert.equal(recorded.mutations.at(-1), 'putFile config.json', 'config.json is the last write');
    const local = join(work, 'from-s3');
    mkdirSync(local);
    for (const name of names(r)) await recorded.getFile(name, join(local, name));
    await assertIsSource(local, 0);

    // the third upload fails: the prefix holds two files and no config.json, so no reader takes it
    const faulty = new FaultyStore(s3Target('library/failed'));
    faulty.failAt = 4; // delete config.json, then putFile, putFile, putFile <- fails
    await assert.rejects(
      exportCheckpoint({
        store,
        campaignId,
        target: { kind: 'store', store: faulty },
        maxShardBytes: shardBytes,
      }),
      /injected fault/,
    );
    const left = (await snapshot(s3, bucket)).objects;
    assert.equal([...left.keys()].filter((k) => k.startsWith('library/failed/')).length, 2);
    assert.ok(!left.has('library/failed/config.json'));
    // a target that is not empty is refused, and replaced when asked
    await assert.rejects(
      exportCheckpoint({ store, campaignId, target: { kind: 'store', store: faulty.inner } }),
      /export target s3:\/\/.*library\/failed\/.* is not empty/,
    );
    const again = await exportCheckpoint({
      store,
      campaignId,
      target: { kind: 'store', store: faulty.inner },
      replace: true,
    });
    // one model.safetensors now: the failed run's shards are gone, config.json came last
    assert.equal(names(again).at(-1), 'config.json');
    assert.ok(names(again).includes('model.safetensors'));
    const replaced = [...(await snapshot(s3, bucket)).objects.keys()].filter((k) =>
      k.startsWith('library/failed/'),
    );
    assert.deepEqual(
      replaced.sort(),
      names(again)
        .map((n) => `library/failed/${n}`)
        .sort(),
    );
  });

  it('stops when its signal aborts (after the download), publishing nothing and leaving no temporary files', async () => {
    const out = join(work, 'aborted', 'model');
    const workDir = join(work, 'aborted-work');
    mkdirSync(workDir, { recursive: true });
    const stop = new AbortController();
    await assert.rejects(
      exportCheckpoint({
        store,
        campaignId,
        target: { kind: 'dir', path: out },
        workDir,
        signal: stop.signal,
        onStep: (line) => {
          if (line.startsWith('moe_hf export')) stop.abort();
        },
      }),
      (err: Error) => err.name === 'AbortError',
    );
    assert.deepEqual(readdirSync(join(work, 'aborted')), []);
    assert.deepEqual(readdirSync(workDir), []);
  });

  it('moerl export finds the campaign through Temporal: --iteration, --json, a local folder', async () => {
    const out = join(work, 'cli', 'it0');
    const r = await cli(
      'export',
      campaignId,
      '--iteration',
      '0',
      '--out',
      out,
      '--max-shard-bytes',
      `${shardBytes}`,
      '--json',
    );
    assert.equal(r.code, 0, r.stderr);
    const result = JSON.parse(r.stdout) as ExportResult;
    assert.equal(result.iteration, 0);
    assert.equal(result.checkpoint.key, keys.checkpointKey(campaignId, 0));
    assert.equal(result.out, out);
    await assertIsSource(out, 0);

    // --replace: the folder becomes the other iteration's export, in one model.safetensors now
    const replaced = await cli('export', campaignId, '--iteration', '1', '--out', out, '--replace', '--json');
    assert.equal(replaced.code, 0, replaced.stderr);
    const files = (JSON.parse(replaced.stdout) as ExportResult).files.map((f) => f.name);
    assert.deepEqual(readdirSync(out).sort(), [...files].sort());
    assert.ok(files.includes('model.safetensors') && !files.includes('model.safetensors.index.json'));
    const c = await compare(source(1), out);
    assert.ok(c.bitwise && c.missing.length === 0, JSON.stringify(c));
    assert.deepEqual(readdirSync(join(work, 'cli')), ['it0'], 'nothing left beside it');
  });

  it('moerl export to s3:// (a process with AWS credentials in its environment): a reader never sees config.json early', async () => {
    const prefix = 'cli/latest';
    const sizes = new Map(libraryOut.files.map((f) => [`${prefix}/${f.name}`, f.bytes]));
    const child = spawn(
      process.execPath,
      [
        join(repoRoot(), 'bin', 'moerl.js'),
        ...['export', campaignId, '--out', `s3://${bucket}/${prefix}`, '--s3-endpoint', gw.endpoint],
        ...['--max-shard-bytes', `${shardBytes}`, '--address', t.address, '--namespace', t.namespace],
      ],
      { env: { ...process.env, ...awsEnv(gw) }, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let output = '';
    child.stdout.on('data', (d: Buffer) => (output += d.toString()));
    child.stderr.on('data', (d: Buffer) => (output += d.toString()));
    const exited = new Promise<number | null>((resolve) => child.on('close', resolve));
    let running = true;
    void exited.then(() => (running = false));
    // What a reader listing the bucket meanwhile sees: config.json only beside every other file, whole.
    let listings = 0;
    while (running) {
      const objects = (await snapshot(s3, bucket)).objects;
      listings++;
      if (objects.has(`${prefix}/config.json`))
        for (const [key, bytes] of sizes)
          assert.equal(objects.get(key), bytes, `${key} when config.json is listed`);
    }
    assert.equal(await exited, 0, output);
    assert.ok(listings > 1, `${listings} listings`);
    assert.match(output, new RegExp(`exported ${campaignId} iteration 1 .* to s3://${bucket}/${prefix}/`));
    const target = s3Target(prefix);
    for (const f of libraryOut.files)
      assert.ok(
        (await target.get(f.name)).equals(readFileSync(join(work, 'library', 'latest', f.name))),
        `${f.name} equals the local export's`,
      );
  });

  describe('bad input: one line on stderr naming the problem', () => {
    const oneLine = async (args: string[], code: number, pattern: RegExp) => {
      const r = await cli('export', ...args);
      assert.equal(r.code, code, r.stderr);
      assert.equal(r.stdout, '');
      assert.match(r.stderr, /^moerl: [^\n]*\n$/);
      assert.match(r.stderr, pattern);
    };
    const out = () => join(work, 'bad', randomUUID().slice(0, 8));

    it('an unknown campaign', async () => {
      await oneLine(['no-such-campaign', '--out', out()], 1, /campaign "no-such-campaign" not found/);
      await assert.rejects(
        exportCheckpoint({ store, campaignId: 'ghost', target: { kind: 'dir', path: out() } }),
        /campaign ghost has nothing in fs:.*: no such campaign there/,
      );
    });

    it('an iteration that is not committed', async () => {
      await oneLine(
        [campaignId, '--iteration', '7', '--out', out()],
        1,
        new RegExp(
          `campaign ${campaignId} has no committed checkpoint of iteration 7 .*\\(committed and kept: 0, 1\\)`,
        ),
      );
      await oneLine(
        [campaignId, '--iteration', 'latest', '--out', out()],
        2,
        /--iteration must be an integer ≥ 0/,
      );
    });

    it('a campaign that did not start from a Hugging Face model', async () => {
      await oneLine(
        [plainId, '--out', out()],
        1,
        new RegExp(
          `campaign ${plainId} did not start from a Hugging Face model: .* has no campaigns/${plainId}/model/config.json`,
        ),
      );
    });

    it('a bad --out', async () => {
      await oneLine([campaignId], 2, /export needs --out DIR or --out s3:\/\/bucket\/prefix/);
      await oneLine(
        [campaignId, '--out', 'gs://models/x'],
        2,
        /--out: got "gs:\/\/models\/x"; expected a local directory or s3:\/\/bucket\/prefix/,
      );
      await oneLine(
        [campaignId, '--out', 's3://Not_A_Bucket/x'],
        2,
        /"Not_A_Bucket" .* is not a valid S3 bucket name/,
      );
      await oneLine([campaignId, '--out', `s3://${bucket}`], 2, /give a prefix inside the bucket/);
      await oneLine(
        [campaignId, '--out', out(), '--s3-region', 'eu-west-1'],
        2,
        /apply to an s3:\/\/ --out only/,
      );
      const full = join(work, 'library', 'latest');
      await oneLine(
        [campaignId, '--out', full],
        1,
        /export target .*latest is not empty: choose a new or empty directory/,
      );
      const file = join(work, 'a-file');
      writeFileSync(file, 'x');
      await oneLine([campaignId, '--out', file], 1, /export target .*a-file exists and is not a directory/);
    });
  });
});
