// Recording workflow histories for the replay test (test/unit/replay.test.ts). A recorded
// history is evidence of what some release of the workflow did, so it is never rewritten: a
// history that no longer replays is a determinism break to fix (patched()), not a file to refresh.
import { mkdirSync, writeFileSync } from 'node:fs';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { historyToJSON } from '@temporalio/common/lib/proto-utils.js';
import type { History } from '@temporalio/common/lib/proto-utils.js';

export const historiesDir = fileURLToPath(new URL('../../../test/histories/', import.meta.url));
const repoRoot = fileURLToPath(new URL('../../../', import.meta.url));

/**
 * The history as committed: failures' stack traces name files relative to the repository (a
 * recorded file holds no path of the machine it was recorded on). A payload holding such a path
 * is refused: payloads are replayed as they are.
 */
function portableJSON(name: string, history: History): string {
  const json = historyToJSON(history).replaceAll(pathToFileURL(repoRoot).href, '').replaceAll(repoRoot, '');
  const payloads = json.match(/"data": "[A-Za-z0-9+/=]*"/g) ?? [];
  for (const p of payloads)
    if (Buffer.from(p.slice(9, -1), 'base64').toString('utf8').includes(repoRoot))
      throw new Error(
        `history ${name}: a payload holds the path ${repoRoot}; record it from a spec without one`,
      );
  return json;
}

const historyName = /^[a-z0-9]+(?:[.-][a-z0-9]+)*$/;

/**
 * With MOERL_RECORD_HISTORIES=1, writes the (closed) workflow's history to
 * test/histories/<name>.json, unless that file exists: then it says so and leaves it as it is.
 * Returns whether it wrote the file.
 */
export async function maybeRecordHistory(
  handle: { workflowId: string; fetchHistory(): Promise<History> },
  name: string,
): Promise<boolean> {
  if (process.env.MOERL_RECORD_HISTORIES !== '1') return false;
  if (!historyName.test(name))
    throw new Error(
      `history name "${name}": use lower-case letters, digits, '-' and '.' (it is a file name)`,
    );
  const file = `${historiesDir}${name}.json`;
  mkdirSync(historiesDir, { recursive: true });
  const json = portableJSON(name, await handle.fetchHistory());
  try {
    // 'wx' fails if the file exists, so a concurrent or repeated run cannot replace it either.
    writeFileSync(file, json, { flag: 'wx' });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    console.log(
      `history ${name}: test/histories/${name}.json exists; recorded histories are never rewritten, skipped`,
    );
    return false;
  }
  console.log(`history ${name}: recorded test/histories/${name}.json from workflow ${handle.workflowId}`);
  return true;
}
