// A training job with nothing to run, for launcher and manifest tests: the name, ranks and owner
// are what the tests vary; the job description is empty.
import type { TrainJobSpec } from '../../activities/launch/types.js';

export function emptyTrainJob(
  name: string,
  worldSize: number,
  owner: TrainJobSpec['owner'],
  region = 'us-east-1',
): TrainJobSpec {
  return {
    name,
    worldSize,
    job: {
      store: { kind: 's3', bucket: 'moerl-test', prefix: '', region, forcePathStyle: false },
      checkpoints: [],
      inputLists: [],
      steps: [],
      outputs: [],
    },
    env: {},
    provider: 'tcp',
    owner,
  };
}
