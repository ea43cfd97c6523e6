// The SDK's log lines, its Rust core's included, go through the worker's logger at the level
// each deserves: `moerl demo` printed the core's "Query not found" warning amid its progress.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { LogLevel } from '@temporalio/worker';
import { sdkLogLevel, sdkRuntimeOptions } from '../../workers/telemetry.js';

function logsAt(level: LogLevel) {
  const lines: string[] = [];
  const options = sdkRuntimeOptions({ logs: { level, write: (line) => lines.push(line) } });
  return { options, lines };
}

describe('worker SDK logs', () => {
  test('the core forwards its log lines to the worker’s logger instead of printing them itself', () => {
    const { options } = logsAt('WARN');
    const logging = options.telemetryOptions?.logging;
    assert.ok(logging && 'forward' in logging, `forwarded: ${JSON.stringify(logging)}`);
    assert.deepEqual(logging.filter, { core: 'WARN', other: 'ERROR' });
    assert.deepEqual(logsAt('INFO').options.telemetryOptions?.logging?.filter, {
      core: 'INFO',
      other: 'ERROR',
    });
    assert.deepEqual(options.shutdownSignals, [], 'the process owns its signals');
  });

  test('an expected warning is a debug line: the demo (at WARN) shows none of it', () => {
    const { options, lines } = logsAt('WARN');
    const logger = options.logger!;
    logger.warn('Query not found when attempting to respond to it', {
      sdkComponent: 'core',
      target: 'temporal_sdk_core::worker::workflow',
      error: 'status: NotFound',
    });
    logger.warn('No workflows registered, not polling for workflow tasks');
    logger.info('Worker state changed');
    assert.deepEqual(lines, []);
    logger.warn('Activity task timed out', { error: 'deadline' });
    logger.error('Workflow task failed', { runId: 'r1', attempt: 2 });
    assert.deepEqual(lines, [
      '[WARN] Activity task timed out error=deadline',
      '[ERROR] Workflow task failed runId=r1 attempt=2',
    ]);
  });

  test('a worker at INFO writes info lines, and expected warnings only at DEBUG', () => {
    const { options, lines } = logsAt('INFO');
    options.logger!.info('Worker state changed', { state: 'RUNNING' });
    options.logger!.warn('Query not found when attempting to respond to it');
    assert.deepEqual(lines, ['[INFO] Worker state changed state=RUNNING']);
    assert.equal(
      sdkLogLevel({ level: 'WARN', message: 'Query not found when attempting to respond to it' }),
      'DEBUG',
    );
    assert.equal(sdkLogLevel({ level: 'WARN', message: 'Query response too large' }), 'WARN');
  });
});
