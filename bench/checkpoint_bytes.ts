// Bytes each reader of a committed checkpoint fetches from the store: a rollout worker (its
// checkpoint cache, what moe_generate reads; moerl export fetches the same files) and each rank
// of the next update's trainer. The checkpoint is real: moe_train init and an SFT warm start on
// the demo campaign's model (examples/demo.yaml) and EP ranks, so the AdamW moments are not
// zero, staged and committed to an fs store. Bytes are counted at the store: every byte that
// get/getFile returned, the manifest included.
// The last line of stdout is one JSON object.
//
// usage: node dist/bench/checkpoint_bytes.js [--sft-steps 20]
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import {
  CheckpointCache,
  commitCheckpoint,
  fetchCheckpointForRank,
  stageCheckpoint,
} from '../activities/checkpoints.js';
import { rankEnv } from '../activities/launch/types.js';
import { nativeToolPath } from '../activities/native.js';
import { FsStore } from '../activities/store/index.js';
import type { ObjectStore } from '../activities/store/index.js';
import type { CheckpointManifest } from '../activities/types.js';
import { freePort } from '../cli/dev-server.js';
import { demoSpecPath } from '../cli/commands/demo.js';
import { loadSpecFile } from '../cli/spec-file.js';
import { isHfModel } from '../workflows/spec-model.js';

const { values } = parseArgs({ options: { 'sft-steps': { type: 'string', default: '20' } } });

/** `store`, counting the bytes its reads return. */
function counting(store: ObjectStore): { store: ObjectStore; bytes: () => number } {
  let bytes = 0;
  const counted: ObjectStore = Object.create(store) as ObjectStore;
  counted.get = async (key) => {
    const body = await store.get(key);
    bytes += body.length;
    return body;
  };
  counted.getFile = async (key, local) => {
    await store.getFile(key, local);
    bytes += statSync(local).size;
  };
  return { store: counted, bytes: () => bytes };
}

/** moe_train `args` on `worldSize` local ranks (tcp on loopback). */
async function moeTrain(worldSize: number, args: string[]): Promise<void> {
  const port = await freePort();
  await Promise.all(
    Array.from({ length: worldSize }, (_, rank) => {
      const child = spawn(nativeToolPath('moe_train'), args, {
        env: {
          ...process.env,
          OPENBLAS_NUM_THREADS: '1',
          [rankEnv.rank]: String(rank),
          [rankEnv.worldSize]: String(worldSize),
          [rankEnv.coordinator]: `127.0.0.1:${port}`,
          [rankEnv.provider]: 'tcp',
        },
        stdio: ['ignore', 'ignore', 'inherit'],
      });
      return new Promise<void>((resolve, reject) =>
        child.on('exit', (code) =>
          code === 0 ? resolve() : reject(new Error(`moe_train ${args[0]} rank ${rank} exited with ${code}`)),
        ),
      );
    }),
  );
}

const spec = loadSpecFile(demoSpecPath);
const m = spec.model;
if (isHfModel(m)) throw new Error(`${demoSpecPath}: a native model was expected`);
const ranks = spec.epWorldSize;
const root = mkdtempSync(join(tmpdir(), 'moerl-checkpoint-bytes-'));
try {
  // prettier-ignore
  await moeTrain(ranks, [
    'init', '--out', join(root, 'init'), '--seed', String(spec.seed),
    '--dim', String(m.hidden), '--layers', String(m.layers), '--heads', String(m.heads),
    '--experts', String(m.experts), '--top-k', String(m.topK),
    '--expert-dim', String(m.expertHidden ?? m.hidden), '--max-seq-len', String(m.contextLength),
  ]);
  // prettier-ignore
  await moeTrain(ranks, [
    'sft', '--checkpoint', join(root, 'init'), '--out', join(root, 'sft'),
    '--task', 'reverse', '--steps', values['sft-steps'],
  ]);
  const store = new FsStore(join(root, 'store'));
  const staged = await stageCheckpoint(store, join(root, 'sft'), 'bench', 0);
  const opts = { meanReward: null, keepLast: 1, keepBest: false, keepIteration: 0, now: new Date() };
  const { checkpoint } = await commitCheckpoint(store, staged, opts);
  const manifest = JSON.parse(
    (await store.get(`${checkpoint.key}/manifest.json`)).toString(),
  ) as CheckpointManifest;

  const rollout = counting(store);
  const cache = new CheckpointCache(join(root, 'cache'), { maxCheckpoints: 4, maxBytes: Infinity });
  (await cache.acquire(rollout.store, checkpoint)).release();
  await cache.settled();

  const trainerRanks: number[] = [];
  for (let rank = 0; rank < ranks; rank++) {
    const trainer = counting(store);
    await fetchCheckpointForRank(trainer.store, checkpoint, join(root, `rank-${rank}`), {
      rank,
      worldSize: ranks,
    });
    trainerRanks.push(trainer.bytes());
  }
  console.log(
    JSON.stringify({
      model: { ...m, ranks },
      manifestVersion: manifest.version,
      files: Object.fromEntries(manifest.files.map((f) => [f.name, f.bytes])),
      checkpointBytes: manifest.files.reduce((n, f) => n + f.bytes, 0),
      rolloutWorkerBytes: rollout.bytes(),
      trainerRankBytes: trainerRanks,
    }),
  );
} finally {
  rmSync(root, { recursive: true, force: true });
}
