// The `engine` section of the campaign spec: which engine trains the policy (docs/engines.md).
// Pure zod, like spec.ts: workflows import it.
import { z } from 'zod';

export const trainerEngines = ['native', 'pytorch'] as const;
export type TrainerEngine = (typeof trainerEngines)[number];

export const engineSchema = z.strictObject({
  trainer: z
    .enum(trainerEngines)
    .default('native')
    .describe(
      "the trainer ranks' program: native (moe_train) or pytorch (engines/pytorch, a Hugging Face model only; its ranks need the image or interpreter with torch, docs/engines.md)",
    ),
});

/** The spec's trainer; specs of campaigns started before the field existed train natively. */
export function trainerEngine(spec: { engine?: { trainer: TrainerEngine } }): TrainerEngine {
  return spec.engine?.trainer ?? 'native';
}
