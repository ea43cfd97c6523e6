// `moerl export <id>`: a committed checkpoint of a campaign as a Hugging Face model directory,
// in a local folder or under an S3 prefix, config.json written last (activities/models/export.ts).
// The campaign is looked up in Temporal for its spec, whose store holds the checkpoints and the
// model files the campaign started from.
import type { ExportTarget } from '../../activities/models/export.js';
import type { CampaignSpec } from '../../workflows/spec.js';
import { campaignInput, describeCampaign } from '../campaigns.js';
import type { Command, CommandContext } from '../command.js';
import { UsageError } from '../errors.js';

const bucketPattern = /^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$/;

/** An --out of the form s3://bucket/prefix, checked; null for a local path. */
export function parseS3Out(out: string): { bucket: string; prefix: string } | null {
  if (!/^[a-z][a-z0-9+.-]*:\/\//i.test(out)) return null;
  const m = /^s3:\/\/([^/]*)\/*(.*)$/.exec(out);
  if (!m) throw new UsageError(`--out: got "${out}"; expected a local directory or s3://bucket/prefix`);
  const bucket = m[1] as string;
  const prefix = (m[2] as string).replace(/\/+$/, '');
  if (!bucketPattern.test(bucket))
    throw new UsageError(`--out: "${bucket}" in "${out}" is not a valid S3 bucket name`);
  if (prefix === '')
    throw new UsageError(`--out: got "${out}"; give a prefix inside the bucket, s3://${bucket}/PREFIX`);
  if (prefix.split('/').some((s) => s === '' || s === '.' || s === '..'))
    throw new UsageError(`--out: the prefix "${prefix}" has an empty, "." or ".." segment`);
  return { bucket, prefix };
}

function wholeNumber(flag: string, text: string | undefined, min: number): number | undefined {
  if (text === undefined) return undefined;
  const n = Number(text);
  if (text.trim() === '' || !Number.isSafeInteger(n) || n < min)
    throw new UsageError(`${flag} must be an integer ≥ ${min}, got "${text}"`);
  return n;
}

/** SIGINT and SIGTERM abort `stop` while the export runs; returns the remover. */
function abortOnSignals(stop: AbortController): () => void {
  const onSignal = (signal: NodeJS.Signals) => stop.abort(signal);
  const signals = ['SIGINT', 'SIGTERM'] as const;
  for (const s of signals) process.on(s, onSignal);
  return () => {
    for (const s of signals) process.off(s, onSignal);
  };
}

export const exportCommand: Command = {
  name: 'export',
  summary: 'write a committed checkpoint of a campaign as a Hugging Face model directory (local or S3)',
  usage:
    'export <campaign-id> --out DIR|s3://BUCKET/PREFIX [--iteration N] [--max-shard-bytes N] [--replace]',
  options: {
    out: { type: 'string' },
    iteration: { type: 'string' },
    'max-shard-bytes': { type: 'string' },
    replace: { type: 'boolean' },
    's3-region': { type: 'string' },
    's3-endpoint': { type: 'string' },
  },
  optionHelp: {
    '--out DIR|s3://BUCKET/PREFIX': 'where the model goes: a new or empty folder, or an empty S3 prefix',
    '--iteration N': "the committed checkpoint to export (default: the latest, the store's LATEST)",
    '--max-shard-bytes N':
      'largest safetensors shard; more go with model.safetensors.index.json (default 5e9)',
    '--replace': 'replace what --out holds (an earlier export) instead of refusing a non-empty target',
    '--s3-region R':
      "region of an s3:// --out (default the campaign store's when it is S3, else AWS_REGION, else us-east-1)",
    '--s3-endpoint URL':
      "endpoint of an S3-compatible server for --out, path-style (default the campaign store's when it is S3)",
  },
  details: `The campaign must have started from a Hugging Face model: its store keeps that model's
config.json, tokenizer and generation config under campaigns/<id>/model/. The checkpoint is
downloaded and verified into a temporary folder (TMPDIR; it needs the checkpoint's size), then
moe_hf export writes the model in the source's dtype. config.json is written last: a folder or
prefix with a config.json is a whole export. A local --out is filled beside it and renamed into
place. S3 credentials come from the AWS SDK's usual chain (environment, profile, instance role).
example: moerl export demo-k3j9x2 --iteration 12 --out s3://models/demo-12`,
  positionals: { min: 1, max: 1 },
  campaignIdArgument: true,
  async run(ctx: CommandContext) {
    const id = ctx.positionals[0] as string;
    const out = ctx.string('out');
    if (out === undefined || out === '')
      throw new UsageError('export needs --out DIR or --out s3://bucket/prefix');
    const iteration = wholeNumber('--iteration', ctx.string('iteration'), 0);
    const maxShardBytes = wholeNumber('--max-shard-bytes', ctx.string('max-shard-bytes'), 1);
    const s3Out = parseS3Out(out);
    const endpoint = ctx.string('s3-endpoint');
    if (!s3Out && (endpoint !== undefined || ctx.string('s3-region') !== undefined))
      throw new UsageError('--s3-region and --s3-endpoint apply to an s3:// --out only');
    if (endpoint !== undefined && !/^https?:\/\/[^/]/.test(endpoint))
      throw new UsageError(`--s3-endpoint: got "${endpoint}"; expected an http or https URL`);

    const client = await ctx.client();
    await describeCampaign(client, id);
    const { spec } = await campaignInput(client, id);
    // Loaded only here: the S3 client would slow every other command's start.
    const [{ openStore, S3Store }, { exportCheckpoint }] = await Promise.all([
      import('../../activities/store/index.js'),
      import('../../activities/models/export.js'),
    ]);
    const store = openStore(spec.store);
    let target: ExportTarget = { kind: 'dir', path: out };
    if (s3Out)
      try {
        target = {
          kind: 'store',
          store: new S3Store({ ...s3Out, ...s3Settings(ctx, spec.store, endpoint) }),
        };
      } catch (err) {
        throw new UsageError(`--out: ${err instanceof Error ? err.message : String(err)}`);
      }

    const stop = new AbortController();
    const removeSignalHandlers = abortOnSignals(stop);
    ctx.io.signal?.addEventListener('abort', () => stop.abort(ctx.io.signal?.reason), { once: true });
    try {
      const result = await exportCheckpoint({
        store,
        campaignId: id,
        target,
        replace: ctx.values.replace === true,
        signal: stop.signal,
        onStep: (line) => ctx.note(`moerl export: ${line}`),
        ...(iteration === undefined ? {} : { iteration }),
        ...(maxShardBytes === undefined ? {} : { maxShardBytes }),
      });
      ctx.print(result, () =>
        [
          `exported ${id} iteration ${result.iteration} (${result.checkpoint.key}) to ${result.out} in ${result.seconds.toFixed(1)} s`,
          ...result.files.map((f) => `  ${f.name}  ${f.bytes} bytes`),
        ].join('\n'),
      );
    } catch (err) {
      if (!stop.signal.aborted) throw err;
      ctx.note(`moerl: export: stopped by ${String(stop.signal.reason)}; ${out} holds no whole export`);
      return 130;
    } finally {
      removeSignalHandlers();
    }
  },
};

/** Region, endpoint and addressing of an s3:// --out: the flags, else the campaign store's. */
function s3Settings(ctx: CommandContext, store: CampaignSpec['store'], endpoint: string | undefined) {
  const fromStore = store.kind === 's3' ? store : undefined;
  const region =
    ctx.string('s3-region') ??
    fromStore?.region ??
    ctx.io.env.AWS_REGION ??
    ctx.io.env.AWS_DEFAULT_REGION ??
    'us-east-1';
  if (endpoint !== undefined) return { region, endpoint, forcePathStyle: true };
  return {
    region,
    forcePathStyle: fromStore?.forcePathStyle ?? false,
    ...(fromStore?.endpoint ? { endpoint: fromStore.endpoint } : {}),
  };
}
