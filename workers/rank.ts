// The rank program: what every trainer rank runs, as a local process (LocalLauncher) or as the
// command of a pod (KubernetesLauncher). It reads the rank contract from its environment,
// fetches its own inputs from the store into its own scratch directory, runs the trainer's steps
// (native moe_train, or the PyTorch trainer of engines/pytorch), and uploads its own outputs; it never reads the launching worker's files, so a rank behaves
// the same on any node.
//
//   MOERL_RANK (or JOB_COMPLETION_INDEX in a pod)  MOERL_WORLD_SIZE  MOERL_COORDINATOR
//   MOERL_FI_PROVIDER  MOERL_JOB (the RankJob as JSON)  MOERL_WORK_DIR (scratch; default a
//   temporary directory)  MOERL_NATIVE_BIN (moe_train's directory; default this build's)
//   MOERL_PYTORCH_PYTHON (the PyTorch trainer's interpreter; activities/engines/pytorch.ts)
//   MOERL_COORDINATOR_PORT_FILE (with port 0: step i's rank 0 publishes its port in `<file>.<i>`)
//   and, read by the native core only: MOERL_JOB_TOKEN  MOERL_STARTUP_TIMEOUT_S  MOERL_TIMEOUT_S
//   MOERL_BIND_ADDRESS (docs/native-ep.md, "Rank env contract")
//
// The job's last moe_train step keeps its group until every rank has stored its outputs: it
// tells this program on a descriptor of its own (MOERL_STORED_FD, native/tools/moe_cli.h) when
// they are written, this program uploads them and answers, and the step then waits for the
// other ranks. So no rank exits 0 while another's outputs may still be missing: a rank lost
// before then stops every rank (75) and the job restarts as a gang.
//
// Exit 0 = done; 2 = bad input (the job must not be retried); 75 = another rank was lost (the
// job restarts as a gang, not counted against this rank); 143 = stopped; anything else = this
// rank's own retryable failure.
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import type { Duplex } from 'node:stream';
import { createReadStream } from 'node:fs';
import { mkdir, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { extname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  fetchCheckpointForRank,
  fetchHuggingFaceForRank,
  parseManifest,
  sha256OfStream,
  withHuggingFaceFiles,
} from '../activities/checkpoints.js';
import { mapLimit } from '../activities/concurrency.js';
import type { RankJob } from '../activities/launch/types.js';
import { rankEnv, rankPeerLostExitCode, rankStoppedExitCode } from '../activities/launch/types.js';
import { pytorchTrainer } from '../activities/engines/pytorch.js';
import * as keys from '../activities/layout.js';
import { fetchModelForRank } from '../activities/models/source.js';
import { nativeToolPath } from '../activities/native.js';
import { openStore, StoreKeyError, StoreNotFoundError } from '../activities/store/index.js';
import type { ObjectStore } from '../activities/store/index.js';
import { badInputErrorType } from '../activities/types.js';

/** Downloads and uploads in flight at once per rank. */
const transferConcurrency = 16;

class RankInputError extends Error {}

interface RankContract {
  rank: number;
  worldSize: number;
  job: RankJob;
  work: string;
}

function readContract(env: NodeJS.ProcessEnv): RankContract {
  const int = (name: string, value: string | undefined) => {
    const n = Number(value);
    if (value === undefined || value === '' || !Number.isInteger(n) || n < 0)
      throw new RankInputError(`${name} must be a non-negative integer, got ${JSON.stringify(value)}`);
    return n;
  };
  const rank = int(rankEnv.rank, env[rankEnv.rank] ?? env.JOB_COMPLETION_INDEX);
  const worldSize = int(rankEnv.worldSize, env[rankEnv.worldSize]);
  if (rank >= worldSize) throw new RankInputError(`rank ${rank} is not below the world size ${worldSize}`);
  let job: RankJob;
  try {
    job = JSON.parse(env[rankEnv.job] ?? '') as RankJob;
  } catch (err) {
    throw new RankInputError(`${rankEnv.job} is not valid JSON: ${(err as Error).message}`);
  }
  for (const field of ['checkpoints', 'inputLists', 'steps', 'outputs'] as const)
    if (!Array.isArray(job?.[field])) throw new RankInputError(`${rankEnv.job}.${field} must be an array`);
  const work = env[rankEnv.workDir] || join(tmpdir(), `moerl-rank-${rank}`);
  return { rank, worldSize, job, work };
}

async function fetchInputList(
  store: ObjectStore,
  work: string,
  list: RankJob['inputLists'][number],
): Promise<void> {
  const index = JSON.parse((await store.get(list.indexKey)).toString('utf8')) as { keys?: unknown };
  if (!Array.isArray(index.keys) || !index.keys.every((k) => typeof k === 'string'))
    throw new RankInputError(`${list.indexKey} is not an index object ({"keys": [...]})`);
  const dir = join(work, list.dir);
  await mkdir(dir, { recursive: true });
  const paths = await mapLimit(index.keys as string[], transferConcurrency, async (key, i) => {
    const path = join(dir, `${i}${extname(key)}`);
    await store.getFile(key, path);
    return path;
  });
  await writeFile(join(work, list.listFile), paths.join('\n') + '\n');
}

async function uploadOutputs(store: ObjectStore, work: string, output: RankJob['outputs'][number]) {
  const dir = join(work, output.dir);
  const names = await readdir(dir).catch(() => [] as string[]); // a rank may have none
  const files: string[] = [];
  for (const name of names)
    if (
      (!output.only || output.only.includes(name)) &&
      !output.exclude?.includes(name) &&
      (await stat(join(dir, name))).isFile()
    )
      files.push(name);
  await mapLimit(files, transferConcurrency, (name) =>
    store.putFile(`${output.prefix}/${name}`, join(dir, name)),
  );
}

/** The native steps running now: SIGTERM goes to them, and the rank ends when they do. */
const runningSteps = new Set<ChildProcess>();
/** Set on SIGTERM: the rank then exits rankStoppedExitCode whatever its step does. */
let stopped = false;

/** A step's channel to this program, and the variable naming it (moe_cli.h, wait_until_stored). */
const storedFd = 3;
const storedFdEnv = 'MOERL_STORED_FD';

/**
 * Runs a step, its output passed straight through as this rank's log. With `store`, the step
 * gets MOERL_STORED_FD: when it says its outputs are written, `store` uploads them and the step
 * is told so; if `store` fails, the channel closes (the step then fails) and its error is
 * thrown once the step has ended.
 */
function runStep(
  tool: string,
  args: string[],
  env: NodeJS.ProcessEnv = {},
  store?: () => Promise<void>,
): Promise<number | null> {
  return new Promise((resolve, reject) => {
    const child = spawn(tool, args, {
      stdio: ['ignore', 'inherit', 'inherit', ...(store ? (['pipe'] as const) : [])],
      env: {
        ...process.env,
        OPENBLAS_NUM_THREADS: process.env.OPENBLAS_NUM_THREADS ?? '1',
        ...env,
        ...(store ? { [storedFdEnv]: String(storedFd) } : {}),
      },
    });
    runningSteps.add(child);
    let storing: Promise<unknown> = Promise.resolve();
    let failure: unknown = null;
    if (store) {
      const channel = child.stdio[storedFd] as Duplex;
      channel.on('error', () => undefined); // the step is gone: its exit says how
      let said = '';
      channel.on('data', (chunk: Buffer) => {
        said += chunk.toString();
        if (!said.includes('\n')) return;
        const line = said.slice(0, said.indexOf('\n'));
        said = said.slice(line.length + 1);
        storing =
          line === 'written'
            ? store().then(
                () => channel.write('stored\n'),
                (err: unknown) => {
                  failure = err;
                  channel.destroy();
                },
              )
            : Promise.resolve(channel.destroy());
      });
    }
    child.on('error', reject);
    child.on('exit', (code) => {
      runningSteps.delete(child);
      // An upload still under way ends first: its outcome is part of the step's.
      void storing.then(() => (failure ? reject(failure as Error) : resolve(code)));
    });
  });
}

async function runRank(env: NodeJS.ProcessEnv): Promise<number> {
  const { rank, worldSize, job, work } = readContract(env);
  const store = openStore(job.store);
  await removeDir(work);
  await mkdir(work, { recursive: true });
  for (const c of job.checkpoints)
    if (c.part === 'huggingFace') await fetchHuggingFaceForRank(store, c.ref, join(work, c.dir));
    else
      await fetchCheckpointForRank(store, c.ref, join(work, c.dir), {
        rank,
        worldSize,
        ...(c.part === 'weights' ? { part: c.part } : {}),
      });
  for (const list of job.inputLists) await fetchInputList(store, work, list);
  if (job.hfModel && (!job.hfModel.whole || rank === 0)) {
    const model = { store: openStore(job.hfModel.store), prefix: job.hfModel.prefix };
    const [r, n] = job.hfModel.whole ? [0, 1] : [rank, worldSize];
    await fetchModelForRank(model, join(work, job.hfModel.dir), r, n);
  }
  // The tools write into their output directories; they need not create them.
  for (const output of job.outputs) await mkdir(join(work, output.dir), { recursive: true });
  // Found at the first step: a job of no steps (outputs only) needs no trainer installed.
  let trainer: { tool: string; prefix: string[]; env: NodeJS.ProcessEnv; name: string } | undefined;
  const findTrainer = () => {
    if (job.trainer !== 'pytorch')
      return { tool: nativeToolPath('moe_train'), prefix: [], env: {}, name: 'moe_train' };
    const t = pytorchTrainer(process.env);
    return { tool: t.python, prefix: ['-m', 'moerl_pytorch'], env: t.env, name: 'moerl-pytorch' };
  };
  let stored = false;
  const storeOutputs = async () => {
    if (job.hfCheckpoint && rank === 0) {
      const code = await joinHuggingFace(work, job.hfCheckpoint);
      if (code !== 0) throw new RankExit(code);
    }
    for (const output of job.outputs)
      if (output.rank === undefined || output.rank === rank) await uploadOutputs(store, work, output);
    stored = true;
  };
  // Each step forms its group afresh: with a published port (the local launchers) each step's
  // rank 0 publishes in a file of its own, so no rank dials the port of a step that has ended.
  const portFile = process.env[rankEnv.coordinatorPortFile];
  for (const [i, step] of job.steps.entries()) {
    trainer ??= findTrainer();
    const args = [...trainer.prefix, ...step.map((a) => a.replaceAll('{work}', work))];
    const env = portFile
      ? { ...trainer.env, [rankEnv.coordinatorPortFile]: `${portFile}.${i}` }
      : trainer.env;
    // moe_train's last step waits until the outputs are stored; the PyTorch trainer does not.
    const last = i === job.steps.length - 1 && trainer.name === 'moe_train';
    const code = await runStep(trainer.tool, args, env, last ? storeOutputs : undefined);
    if (stopped) return rankStoppedExitCode;
    if (code !== 0) {
      console.error(
        `rank ${rank}: ${trainer.name} ${step[0]} ${code === null ? 'was killed' : `exited with code ${code}`}`,
      );
      return code === 2 || code === rankPeerLostExitCode ? code : 1;
    }
  }
  if (!stored) await storeOutputs();
  if (stopped) return rankStoppedExitCode;
  await removeDir(work);
  return 0;
}

/** Ends the rank with this exit code (its cause is in the log already). */
class RankExit extends Error {
  constructor(readonly code: number) {
    super(`exit ${code}`);
  }
}

/**
 * Makes the Hugging Face directory `{work}/<dir>` part of the checkpoint in `{work}/out`: the
 * moerl checkpoint that native rollouts read is imported from it (moe_train init --from-hf, as a
 * world of one: the directory is whole on rank 0 only), then its files are hashed into the
 * manifest. A directory moe_train cannot import is bad input (2), named in the log.
 */
async function joinHuggingFace(work: string, hf: NonNullable<RankJob['hfCheckpoint']>): Promise<number> {
  const dir = join(work, hf.dir);
  const out = join(work, 'out');
  // prettier-ignore
  const code = await runStep(
    nativeToolPath('moe_train'),
    ['init', '--from-hf', dir, '--out', out, ...hf.initArgs],
    { [rankEnv.rank]: '0', [rankEnv.worldSize]: '1', [rankEnv.coordinator]: '' },
  );
  if (code !== 0) {
    console.error(
      `rank 0: the Hugging Face directory ${dir} ${code === 2 ? 'is not a model moerl can import' : 'was not imported'}: moe_train init ${code === null ? 'was killed' : `exited with code ${code}`}`,
    );
    return code === 2 ? 2 : 1;
  }
  const files: { name: string; bytes: number; sha256: string }[] = [];
  for (const name of (await readdir(dir)).sort()) {
    const path = join(dir, name);
    if (!(await stat(path)).isFile())
      throw new RankInputError(`${path} is not a file: a Hugging Face directory is flat`);
    files.push({ name, ...(await sha256OfStream(createReadStream(path))) });
  }
  const manifestPath = join(out, keys.manifestName);
  const manifest = parseManifest(await readFile(manifestPath, 'utf8'), manifestPath);
  await writeFile(manifestPath, JSON.stringify(withHuggingFaceFiles(manifest, files, dir)));
  return 0;
}

/**
 * Removes `dir`. In a pod it is an emptyDir mount point, which cannot be removed itself (rmdir
 * fails with EACCES or EBUSY, and rm then leaves the contents too): its contents go first.
 */
async function removeDir(dir: string): Promise<void> {
  for (const entry of await readdir(dir).catch(() => []))
    await rm(join(dir, entry), { recursive: true, force: true });
  await rm(dir, { recursive: true, force: true }).catch((err: NodeJS.ErrnoException) => {
    if (err.code !== 'EACCES' && err.code !== 'EBUSY') throw err;
  });
}

const isBadInput = (err: unknown) =>
  err instanceof RankInputError ||
  err instanceof StoreNotFoundError ||
  err instanceof StoreKeyError ||
  (err as { type?: string } | null)?.type === badInputErrorType;

export async function main(env: NodeJS.ProcessEnv = process.env): Promise<number> {
  try {
    return await runRank(env);
  } catch (err) {
    if (err instanceof RankExit) return stopped ? rankStoppedExitCode : err.code;
    console.error(`rank program: ${(err as Error).message ?? String(err)}`);
    return isBadInput(err) ? 2 : 1;
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  // Ranks are stopped with SIGTERM when a peer fails or the job is cancelled: during a native
  // step the tool gets it and the rank fails when the tool exits; otherwise the rank ends now.
  // Either way it exits 143 (rankStoppedExitCode: a preemption or a drain is no failure).
  process.on('SIGTERM', () => {
    stopped = true;
    if (runningSteps.size > 0) for (const step of runningSteps) step.kill('SIGTERM');
    else process.exit(rankStoppedExitCode);
  });
  const code = await main();
  process.exitCode = stopped ? rankStoppedExitCode : code;
}
