// Lint for the TypeScript sources; workflow code gets the extra determinism rules.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['dist/', 'node_modules/', 'native/', 'bin/'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
    },
  },
  {
    // Workflow code is replayed: no wall clock, no randomness, no I/O.
    files: ['workflows/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        { patterns: ['node:*', 'fs', 'path', 'child_process', '@temporalio/client', '@temporalio/worker', '../activities/*!(types.js)'] },
      ],
      'no-restricted-properties': [
        'error',
        { object: 'Math', property: 'random', message: 'Use the workflow random (it is replay-safe).' },
        { object: 'Date', property: 'now', message: 'Workflow time comes from the workflow clock.' },
      ],
    },
  },
);
