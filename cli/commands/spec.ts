// `moerl spec schema` and `moerl spec check <file>`: the spec's JSON Schema and offline validation.
import { SpecError, campaignSpecJsonSchema } from '../../workflows/spec.js';
import { specSummary } from '../campaigns.js';
import type { Command, CommandContext } from '../command.js';
import { UsageError } from '../errors.js';
import { loadSpecFile, parseOverride } from '../spec-file.js';

export const specCommand: Command = {
  name: 'spec',
  summary: 'print the spec JSON Schema (spec schema) or validate a spec file (spec check <file>)',
  usage: 'spec schema | spec check <spec.yaml> [--set key=value]...',
  options: { set: { type: 'string', multiple: true } },
  optionHelp: { '--set key=value': 'check with this override applied (dotted path, repeatable)' },
  details: `example: moerl spec schema > campaign-spec.schema.json   (point your editor's YAML schema at it)
         moerl spec check examples/demo.yaml`,
  positionals: { min: 1, max: 2 },
  async run(ctx: CommandContext) {
    const [sub, file] = ctx.positionals;
    if (sub === 'schema') {
      if (file !== undefined) throw new UsageError('spec schema takes no file');
      // The schema is JSON whether or not --json is given.
      ctx.io.stdout.write(`${JSON.stringify(campaignSpecJsonSchema(), null, 2)}\n`);
      return 0;
    }
    if (sub !== 'check') throw new UsageError(`unknown spec subcommand "${sub}" (schema or check)`);
    if (file === undefined) throw new UsageError('spec check needs a spec file');
    const overrides = ctx.strings('set').map(parseOverride);
    try {
      const spec = loadSpecFile(file, overrides);
      ctx.print({ file, valid: true, spec }, () => {
        const s = specSummary(spec);
        return `${file}: valid — ${s.name}: ${s.task}, ${s.model}, ${s.iterations} iterations`;
      });
      return 0;
    } catch (err) {
      if (!(err instanceof SpecError) || !ctx.json) throw err;
      ctx.print({ file, valid: false, problems: err.problems }, () => '');
      return 1;
    }
  },
};
