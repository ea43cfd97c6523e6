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
    // Workflow code is replayed: no I/O and no Node APIs (the sandbox already makes Date and
    // Math.random deterministic), and activities are imported as types only.
    files: ['workflows/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            'node:*',
            'fs',
            'path',
            'child_process',
            '@temporalio/client',
            '@temporalio/worker',
            '../activities/*!(types.js)',
          ],
        },
      ],
    },
  },
);
