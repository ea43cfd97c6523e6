// The `engine` section of the campaign spec: which engine trains the policy and which samples its
// rollouts (docs/engines.md).
// Pure zod, like spec.ts: workflows import it.
import { z } from 'zod';

export const trainerEngines = ['native', 'pytorch'] as const;
export type TrainerEngine = (typeof trainerEngines)[number];

export const rolloutEngines = ['native', 'openai'] as const;
export type RolloutEngineKind = (typeof rolloutEngines)[number];

export const engineSchema = z.strictObject({
  trainer: z
    .enum(trainerEngines)
    .default('native')
    .describe(
      "the trainer ranks' program: native (moe_train) or pytorch (engines/pytorch, a Hugging Face model only; its ranks need the image or interpreter with torch, docs/engines.md)",
    ),
  rollout: z
    .enum(rolloutEngines)
    .default('native')
    .describe(
      "the rollout activity's sampler: native (moe_generate) or openai (an OpenAI-compatible completions server, a Hugging Face model only; the rollout worker's operator says which server, docs/engines.md)",
    ),
});

/** The spec's trainer; specs of campaigns started before the field existed train natively. */
export function trainerEngine(spec: { engine?: { trainer: TrainerEngine } }): TrainerEngine {
  return spec.engine?.trainer ?? 'native';
}

/** The spec's rollout engine; specs of campaigns started before the field existed sample natively. */
export function rolloutEngine(spec: { engine?: { rollout?: RolloutEngineKind } }): RolloutEngineKind {
  return spec.engine?.rollout ?? 'native';
}
