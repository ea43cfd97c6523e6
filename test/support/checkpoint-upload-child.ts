// A process that stages and commits one local checkpoint on an S3 store with the production
// code (stageCheckpoint, commitCheckpoint), in 5 MiB parts so every file above that goes up as
// a multipart upload: the chaos suite kills it mid-upload and runs it again.
// Usage: node checkpoint-upload-child.js <endpoint> <bucket> <localDir> <campaignId> <iteration>
// (credentials from the AWS_* environment). Prints "staged", then "committed <manifestSha256>".
import { commitCheckpoint, stageCheckpoint } from '../../activities/checkpoints/commit.js';
import { S3Store, minPartSize } from '../../activities/store/index.js';

const [endpoint, bucket, localDir, campaignId, iterationText] = process.argv.slice(2);
if (!endpoint || !bucket || !localDir || !campaignId || !iterationText) {
  console.error('usage: checkpoint-upload-child <endpoint> <bucket> <localDir> <campaignId> <iteration>');
  process.exit(2);
}
const iteration = Number(iterationText);
const store = new S3Store(
  { bucket, prefix: '', region: process.env.AWS_REGION ?? 'us-east-1', endpoint, forcePathStyle: true },
  // Every earlier writer of these keys was killed by the test: their uploads are stale at once.
  { partSize: minPartSize, uploadConcurrency: 2, staleUploadMs: 0 },
);
const staged = await stageCheckpoint(store, localDir, campaignId, iteration);
console.log('staged');
const { checkpoint } = await commitCheckpoint(store, staged, {
  meanReward: null,
  keepLast: 2,
  keepBest: false,
  keepIteration: 0,
  now: new Date(0),
});
console.log(`committed ${checkpoint.manifestSha256}`);
