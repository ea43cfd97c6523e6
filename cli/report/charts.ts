// The report's charts as Vega-Lite specs, each carrying its own data (the page needs nothing
// else). Marks that tests and readers look for have names: hpChange, pause, runStart.
import type { EpisodeStats } from '../../activities/types.js';
import type { ReportModel } from './model.js';
import { loopStages } from './model.js';

type Spec = Record<string, unknown>;
export interface Chart {
  id: string;
  title: string;
  caption: string;
  /** Null when the campaign's sources do not hold the figure: the page says so instead. */
  spec: Spec | null;
}

const width = 760;
/** Stack order of the stage chart, bottom up: the loop's stages in order, then waiting. */
const stageLabels = ['rollout', 'reward', 'update', 'commit', 'waiting'];
const iterationAxis = {
  field: 'iteration',
  type: 'quantitative',
  title: 'iteration',
  axis: { tickMinStep: 1 },
};

/** Vertical rules with labels at iterations (hyperparameter changes, pauses, new runs). */
function markers(name: string, rows: { x: number; label: string }[], color: string): Spec[] {
  if (rows.length === 0) return [];
  return [
    {
      name,
      data: { values: rows },
      mark: { type: 'rule', color, strokeDash: [4, 3], strokeWidth: 1.5 },
      encoding: { x: { field: 'x', type: 'quantitative' }, tooltip: [{ field: 'label' }] },
    },
    {
      name: `${name}Label`,
      data: { values: rows },
      mark: { type: 'text', color, align: 'left', dx: 3, dy: -4, baseline: 'bottom', fontSize: 10, y: 0 },
      encoding: { x: { field: 'x', type: 'quantitative' }, text: { field: 'label' } },
    },
  ];
}

export function charts(model: ReportModel): Chart[] {
  const its = model.iterations;
  const hp = model.hyperparameterChanges.map((c) => ({ x: c.iteration - 0.5, label: c.label }));
  const pauses = model.pauses
    .filter((p) => p.beforeIteration !== null)
    .map((p) => ({
      x: (p.beforeIteration as number) - 0.5,
      label: `paused${p.reason ? `: ${p.reason}` : ''}`,
    }));
  const runStarts = model.runs
    .filter((r) => r.index > 1 && r.firstIteration !== null)
    .map((r) => ({ x: (r.firstIteration as number) - 0.5, label: `run ${r.index} (continue-as-new)` }));

  const reward = its.flatMap((it) => [
    { iteration: it.iteration, series: 'mean reward', value: it.meanReward },
    { iteration: it.iteration, series: 'pass rate', value: it.passRate },
  ]);
  const stages = its.flatMap((it) => [
    ...loopStages.map((s, order) => ({
      iteration: it.iteration,
      stage: s === 'checkpoint' ? 'commit' : s,
      order,
      seconds: it.stageSeconds[s],
    })),
    { iteration: it.iteration, stage: 'waiting', order: loopStages.length, seconds: it.waitingSeconds },
  ]);
  const interruptions = its.flatMap((it) => [
    { iteration: it.iteration, what: 'retries', count: it.retries },
    { iteration: it.iteration, what: 'failed attempts', count: it.failures },
    { iteration: it.iteration, what: 'chunks redone', count: it.chunksRedone ?? 0 },
  ]);
  const trainTerms: [string, keyof NonNullable<(typeof its)[number]['train']>][] = [
    ['loss', 'loss'],
    ['policy loss', 'policyLoss'],
    ['KL', 'kl'],
    ['entropy', 'entropy'],
    ['grad norm', 'gradNorm'],
    ['clip fraction', 'clipFrac'],
    ['aux loss', 'auxLoss'],
  ];
  const training = its.flatMap((it) =>
    it.train ? trainTerms.map(([term, k]) => ({ iteration: it.iteration, term, value: it.train?.[k] })) : [],
  );
  // a log scale: zero (every log-prob equal to the bit) is not drawn
  const mismatch = its.flatMap((it) =>
    it.train?.mismatchKl
      ? [{ iteration: it.iteration, value: it.train.mismatchKl, tisClipFrac: it.train.tisClipFrac }]
      : [],
  );
  const validation = model.validations.flatMap((v) => [
    { iteration: v.iteration, source: v.dataSource, series: 'mean reward', value: v.meanReward },
    { iteration: v.iteration, source: v.dataSource, series: `pass@${v.k}`, value: v.passAtK },
  ]);
  const load = its.flatMap((it) =>
    (it.train?.expertLoadLayers ?? []).flatMap((row, layer) =>
      row.map((share, expert) => ({ iteration: it.iteration, layer: `layer ${layer}`, expert, share })),
    ),
  );
  const ep = its.flatMap((it) =>
    it.train
      ? [
          { iteration: it.iteration, part: 'EP communication', seconds: it.train.epSeconds },
          { iteration: it.iteration, part: 'compute', seconds: it.train.seconds - it.train.epSeconds },
        ]
      : [],
  );
  // agent episodes: counts by name per iteration, and each iteration's means per episode
  const episodeRows = (pick: (e: EpisodeStats) => Record<string, number>) =>
    its.flatMap((it) =>
      Object.entries(it.episodes ? pick(it.episodes) : {}).map(([name, count]) => ({
        iteration: it.iteration,
        name,
        count,
      })),
    );
  const endReasons = episodeRows((e) => e.endReasons);
  const toolCalls = episodeRows((e) => e.toolCalls);
  const toolErrors = episodeRows((e) => e.toolErrors);
  const perEpisode = its.flatMap(({ iteration, episodes: e }) =>
    e && e.episodes > 0
      ? [
          { iteration, what: 'policy turns', value: e.policyTurns / e.episodes },
          { iteration, what: 'tool seconds', value: e.toolSeconds / e.episodes },
          { iteration, what: 'generation seconds', value: e.generationSeconds / e.episodes },
        ]
      : [],
  );
  const countBars = (title: string, values: unknown[]): Spec => ({
    title,
    width: 340,
    height: 140,
    data: { values },
    mark: 'bar',
    encoding: {
      x: { ...iterationAxis, type: 'ordinal' },
      y: { field: 'count', type: 'quantitative', stack: 'zero', title: null, axis: { format: 'd' } },
      color: { field: 'name', type: 'nominal', title: null },
      tooltip: [{ field: 'iteration' }, { field: 'name' }, { field: 'count' }],
    },
  });
  const t0 = new Date(model.header.startedAt).getTime();
  const rel = (iso: string) => (new Date(iso).getTime() - t0) / 1000;
  const end = model.header.wallSeconds;
  const timelinePauses = model.pauses.map((p) => ({
    from: rel(p.requestedAt),
    to: p.resumedAt === null ? end : rel(p.resumedAt),
    label: `paused${p.reason ? `: ${p.reason}` : ''}`,
  }));
  const timelineRuns = model.runs
    .filter((r) => r.index > 1)
    .map((r) => ({ x: rel(r.startedAt), label: `run ${r.index}` }));
  const timelineHp = model.hyperparameterChanges.map((c) => ({ x: rel(c.at), label: `set ${c.label}` }));

  const has = (rows: unknown[]) => rows.length > 0;
  return [
    {
      id: 'reward',
      title: 'Reward and pass rate',
      caption:
        'Mean reward and pass rate of each iteration; dashed: hyperparameter changes, from the first iteration they apply to.',
      spec: has(its)
        ? {
            width,
            height: 220,
            layer: [
              {
                data: { values: reward },
                mark: { type: 'line', point: true },
                encoding: {
                  x: iterationAxis,
                  y: { field: 'value', type: 'quantitative', title: null, scale: { domain: [0, 1] } },
                  color: { field: 'series', type: 'nominal', title: null },
                  tooltip: [{ field: 'iteration' }, { field: 'series' }, { field: 'value', format: '.3f' }],
                },
              },
              ...markers('hpChange', hp, '#b45309'),
            ],
          }
        : null,
    },
    {
      id: 'stages',
      title: 'Stage time per iteration',
      caption:
        'Rollout, reward, update and commit time, and the rest of the iteration (waiting: pauses, retries before a stage, scheduling). Dashed: pauses and new workflow runs.',
      spec: has(its)
        ? {
            width,
            height: 220,
            layer: [
              {
                data: { values: stages },
                mark: 'bar',
                encoding: {
                  x: { ...iterationAxis, type: 'ordinal' },
                  y: {
                    field: 'seconds',
                    type: 'quantitative',
                    aggregate: 'sum',
                    stack: 'zero',
                    title: 'seconds',
                  },
                  color: { field: 'stage', type: 'nominal', sort: stageLabels },
                  order: { field: 'order' },
                  tooltip: [{ field: 'iteration' }, { field: 'stage' }, { field: 'seconds', format: '.2f' }],
                },
              },
            ],
          }
        : null,
    },
    {
      id: 'throughput',
      title: 'Rollout tokens per second',
      caption: 'Generated tokens per second of generation, summed over the shards.',
      spec: has(its)
        ? {
            width,
            height: 180,
            data: {
              values: its.map((it) => ({ iteration: it.iteration, value: it.rolloutTokensPerSecond })),
            },
            mark: { type: 'line', point: true },
            encoding: {
              x: iterationAxis,
              y: { field: 'value', type: 'quantitative', title: 'tokens/s' },
              tooltip: [{ field: 'iteration' }, { field: 'value', format: '.0f' }],
            },
          }
        : null,
    },
    {
      id: 'interruptions',
      title: 'Retries, interruptions and chunks redone',
      caption:
        'Per iteration: attempts beyond the first, failed attempts the history names, rollout chunks regenerated after a lost worker.',
      spec: has(its)
        ? {
            width,
            height: 180,
            layer: [
              {
                data: { values: interruptions },
                mark: 'bar',
                encoding: {
                  x: { ...iterationAxis, type: 'ordinal' },
                  xOffset: { field: 'what' },
                  y: {
                    field: 'count',
                    type: 'quantitative',
                    title: 'count',
                    axis: { format: 'd', tickMinStep: 1 },
                  },
                  color: { field: 'what', type: 'nominal', title: null },
                  tooltip: [{ field: 'iteration' }, { field: 'what' }, { field: 'count' }],
                },
              },
            ],
          }
        : null,
    },
    {
      id: 'timeline',
      title: 'Timeline',
      caption:
        'Every activity from scheduled to closed (retries included), by stage. Shaded: pauses; dashed: new workflow runs (continue-as-new) and hyperparameter changes.',
      spec: has(model.timeline)
        ? {
            width,
            height: 200,
            layer: [
              ...(timelinePauses.length
                ? [
                    {
                      name: 'pause',
                      data: { values: timelinePauses },
                      mark: { type: 'rect', color: '#9ca3af', opacity: 0.35 },
                      encoding: {
                        x: { field: 'from', type: 'quantitative' },
                        x2: { field: 'to' },
                        tooltip: [{ field: 'label' }],
                      },
                    },
                  ]
                : []),
              {
                data: { values: model.timeline },
                mark: { type: 'bar', height: 10 },
                encoding: {
                  x: { field: 'start', type: 'quantitative', title: 'seconds since start' },
                  x2: { field: 'end' },
                  y: { field: 'stage', type: 'nominal', sort: ['prepare', ...loopStages], title: null },
                  color: {
                    field: 'attempts',
                    type: 'quantitative',
                    title: 'attempts',
                    scale: { scheme: 'orangered', domainMin: 1 },
                    legend: { format: 'd', tickMinStep: 1 },
                  },
                  tooltip: [
                    { field: 'stage' },
                    { field: 'iteration' },
                    { field: 'shard' },
                    { field: 'attempts' },
                    { field: 'outcome' },
                  ],
                },
              },
              ...markers('runStart', timelineRuns, '#7c3aed'),
              ...markers('hpChangeTime', timelineHp, '#b45309'),
            ],
          }
        : null,
    },
    {
      id: 'training',
      title: 'Training curves',
      caption: "Per iteration, the mean over the update's optimizer steps (moe_train metrics, rank 0).",
      spec: has(training)
        ? {
            data: { values: training },
            facet: { field: 'term', type: 'nominal', title: null, sort: trainTerms.map(([t]) => t) },
            columns: 4,
            resolve: { scale: { y: 'independent' } },
            spec: {
              width: 160,
              height: 110,
              mark: { type: 'line', point: true },
              encoding: {
                x: iterationAxis,
                y: { field: 'value', type: 'quantitative', title: null },
                tooltip: [{ field: 'iteration' }, { field: 'term' }, { field: 'value', format: '.4g' }],
              },
            },
          }
        : null,
    },
    {
      id: 'mismatch',
      title: 'Rollout vs trainer log-probs',
      caption:
        "KL(rollout || trainer) over the completion tokens of each update's first step (k3 estimate), log scale: rounding (below 1e-6) when the rollouts and the trainer compute the same model alike; the tooltip gives the share of tokens whose truncated importance weight is capped.",
      spec: has(mismatch)
        ? {
            width,
            height: 160,
            data: { values: mismatch },
            mark: { type: 'line', point: true },
            encoding: {
              x: iterationAxis,
              y: { field: 'value', type: 'quantitative', title: 'mismatch KL', scale: { type: 'log' } },
              tooltip: [
                { field: 'iteration' },
                { field: 'value', title: 'mismatch KL', format: '.2e' },
                { field: 'tisClipFrac', title: 'TIS capped', format: '.3f' },
              ],
            },
          }
        : null,
    },
    {
      id: 'validation',
      title: 'Validation by data source',
      caption:
        "The held-out prompts (task.dataset.validation) generated from each validated checkpoint, the initial policy's included, and scored with the campaign's rewards: mean reward over every sample and pass@k (prompts with at least one passing sample of k). One panel for all prompts, then one per data_source.",
      spec: has(validation)
        ? {
            data: { values: validation },
            facet: {
              field: 'source',
              type: 'nominal',
              title: null,
              sort: [...new Set(model.validations.map((v) => v.dataSource))],
            },
            columns: 3,
            spec: {
              width: 230,
              height: 140,
              mark: { type: 'line', point: true },
              encoding: {
                x: iterationAxis,
                y: { field: 'value', type: 'quantitative', title: null },
                color: { field: 'series', type: 'nominal', title: null },
                tooltip: [
                  { field: 'source' },
                  { field: 'iteration' },
                  { field: 'series' },
                  { field: 'value', format: '.3f' },
                ],
              },
            },
          }
        : null,
    },
    {
      id: 'expertLoad',
      title: 'Expert load per layer',
      caption:
        "Share of each layer's (token, slot) picks that went to each expert, mean over the update's steps; uniform is 1 / experts.",
      spec: has(load)
        ? {
            data: { values: load },
            facet: { row: { field: 'layer', type: 'nominal', title: null } },
            spec: {
              width,
              height: 120,
              mark: 'rect',
              encoding: {
                x: { ...iterationAxis, type: 'ordinal' },
                y: { field: 'expert', type: 'ordinal' },
                color: { field: 'share', type: 'quantitative', scale: { scheme: 'viridis' } },
                tooltip: [
                  { field: 'iteration' },
                  { field: 'layer' },
                  { field: 'expert' },
                  { field: 'share', format: '.3f' },
                ],
              },
            },
          }
        : null,
    },
    {
      id: 'episodes',
      title: 'Agent episodes',
      caption:
        "An agentic campaign's episodes per iteration (docs/agents.md): how they ended, the tool calls by tool and the errors by kind, and per episode its policy turns and the seconds spent waiting on tools and generating.",
      spec: has(perEpisode)
        ? {
            columns: 2,
            concat: [
              countBars('episode end reasons', endReasons),
              {
                title: 'per episode',
                width: 340,
                height: 140,
                data: { values: perEpisode },
                mark: { type: 'line', point: true },
                encoding: {
                  x: iterationAxis,
                  y: { field: 'value', type: 'quantitative', title: null },
                  color: { field: 'what', type: 'nominal', title: null },
                  tooltip: [{ field: 'iteration' }, { field: 'what' }, { field: 'value', format: '.3g' }],
                },
              },
              countBars('tool calls by tool', toolCalls),
              ...(has(toolErrors) ? [countBars('tool errors', toolErrors)] : []),
            ],
            resolve: { scale: { color: 'independent' } },
          }
        : null,
    },
    {
      id: 'epCompute',
      title: 'EP communication vs compute in updates',
      caption:
        "Seconds of the update's optimizer steps in EP dispatch/combine and collectives, and the rest (compute).",
      spec: has(ep)
        ? {
            width,
            height: 180,
            data: { values: ep },
            mark: 'bar',
            encoding: {
              x: { ...iterationAxis, type: 'ordinal' },
              y: { field: 'seconds', type: 'quantitative', stack: 'zero' },
              color: { field: 'part', type: 'nominal', title: null },
              tooltip: [{ field: 'iteration' }, { field: 'part' }, { field: 'seconds', format: '.3f' }],
            },
          }
        : null,
    },
  ].map((c) => (c.id === 'stages' && c.spec ? addStageMarkers(c, [...pauses], runStarts) : c));
}

/** Pauses and new runs sit between iterations on the ordinal axis of the stage chart. */
function addStageMarkers(
  chart: Chart,
  pauses: { x: number; label: string }[],
  runs: { x: number; label: string }[],
): Chart {
  const spec = chart.spec as { layer: Spec[] };
  const at = (rows: { x: number; label: string }[]) =>
    rows.map((r) => ({ iteration: r.x + 0.5, label: r.label }));
  const rule = (name: string, rows: { iteration: number; label: string }[], color: string): Spec[] =>
    rows.length === 0
      ? []
      : [
          {
            name,
            data: { values: rows },
            mark: { type: 'rule', color, strokeDash: [4, 3], strokeWidth: 2 },
            encoding: {
              x: { field: 'iteration', type: 'ordinal', bandPosition: 0 },
              tooltip: [{ field: 'label' }],
            },
          },
        ];
  return {
    ...chart,
    spec: {
      ...spec,
      layer: [
        ...spec.layer,
        ...rule('pauseBefore', at(pauses), '#374151'),
        ...rule('runStartBefore', at(runs), '#7c3aed'),
      ],
    },
  };
}
